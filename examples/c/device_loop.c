/* device_loop.c -- the device loop from C, over libarc's scripted model.
 *
 * Build (from the repository root, after pip install -e .):
 *   cc -O2 -Iarcpy examples/c/device_loop.c arcpy/libarc.so -Wl,-rpath,$PWD/arcpy -o device_loop
 *
 * Captures one step (the scripted forward, then the sampler with its commit) into a graph,
 * enqueues a burst of 16 steps, and prints each token as it lands in the ring: no synchronize,
 * no copy, one poll loop.
 */
#include <stdio.h>
#include <stdlib.h>

#include "arc.h"

#define CHECK(call)                                                                    \
    do {                                                                               \
        int st_ = (call);                                                              \
        if (st_ != ARC_OK) {                                                           \
            fprintf(stderr, "%s: %s\n", arc_status_string(st_), arc_last_error());     \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

int main(void) {
    enum { VOCAB = 32000, STEPS = 16 };
    arc_context *ctx;
    arc_loop *loop;
    arc_graph *graph;
    float *logits;
    CHECK(arc_context_create(0, &ctx));
    CHECK(arc_loop_create(ctx, VOCAB, 4096, 64, &loop));
    CHECK(arc_device_alloc(ctx, VOCAB * sizeof(float), (void **)&logits));
    arc_script script = {VOCAB, 31, 7, 3, ARC_SCRIPT_NORMAL, -1, NULL};

    CHECK(arc_graph_capture_begin(ctx));
    int st = arc_script_forward(loop, &script, logits);
    if (st == ARC_OK) st = arc_loop_enqueue_sample_commit(loop, logits, VOCAB);
    int end = arc_graph_capture_end(ctx, &graph);
    CHECK(st);
    CHECK(end);

    while (arc_stream_query(ctx) == ARC_NOT_READY) {}
    CHECK(arc_loop_reset_ring(loop));
    CHECK(arc_loop_set_input(loop, 5, 0));
    for (int i = 0; i < STEPS; ++i) CHECK(arc_loop_enqueue_step(loop, graph, 1));

    uint32_t seen = 0;
    long token = 5, position = 0;
    int mismatches = 0;
    while (seen < STEPS) {
        arc_ring_state s;
        CHECK(arc_ring_poll(loop, &s));
        if (s.fault) {
            fprintf(stderr, "fault %u: token %d at position %d\n", s.fault, s.fault_token, s.fault_pos);
            return 1;
        }
        for (; seen < s.published; ++seen) {
            int32_t t;
            CHECK(arc_ring_read(loop, seen, 1, &t));
            long want = (token * 31 + position * 7 + 3) % VOCAB;
            mismatches += t != want;
            printf("%d ", t);
            token = t;
            position++;
        }
    }
    printf("\n%s\n", mismatches ? "MISMATCH" : "ok: 16 tokens, as scripted");
    while (arc_stream_query(ctx) == ARC_NOT_READY) {}
    arc_graph_destroy(graph);
    arc_device_free(ctx, logits);
    arc_loop_destroy(loop);
    arc_context_destroy(ctx);
    return mismatches != 0;
}
