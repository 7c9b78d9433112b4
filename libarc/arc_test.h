/* arc_test.h -- libarc's test hooks: not part of the decode API. They drive the device loop and
 * its faults on a GPU with no model: a scripted forward whose argmax is a known function of the
 * token and the position, and a lost step injected into the commit. The GPU tests and
 * examples/c/device_loop.c use them; a program that decodes a model needs only arc.h.
 *
 * The declarations between the cdef markers join arc.h's in the cffi cdef of arcpy/_lib.py.
 */
#ifndef ARC_TEST_H
#define ARC_TEST_H

#include "arc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* arc-cdef-begin */
/* ---- Test hooks: Not part of the decode API; the loop and its faults on a GPU, no model. ---- */

/* The scripted model: reads the token and the position as the forward does and writes logits[vocab] whose argmax is
 * (token * mul + position * add + bias) mod vocab; mode selects a misbehaviour at position at_pos. */
typedef enum arc_script_mode {
    ARC_SCRIPT_NORMAL = 0,
    ARC_SCRIPT_ILLEGAL_ADDRESS = 1, /* write through a bad pointer: a sticky fault */
    ARC_SCRIPT_SPIN = 2,            /* spin until *flag != 0 (flag: host-mapped memory) */
    ARC_SCRIPT_TOKEN = 3            /* the argmax is `bias`, whatever the input */
} arc_script_mode;

typedef struct arc_script {
    int32_t vocab;
    int32_t mul;
    int32_t add;
    int32_t bias;
    int32_t mode;
    int32_t at_pos;
    const uint32_t *flag;
} arc_script;

int arc_script_forward(arc_loop *loop, const arc_script *script, float *logits);

/* Fault injection: the n-th commit executed from now (0: the next) does nothing, as if its launch had silently been
 * lost. n < 0 disarms. Stream-ordered. */
int arc_loop_inject_lost_step(arc_loop *loop, int32_t n);

/* arc-cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* ARC_TEST_H */
