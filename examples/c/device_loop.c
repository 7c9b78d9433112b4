/* device_loop.c -- the device loop from C, over libarc's scripted model.
 *
 * Build from any directory, after `pip install .` or `pip install -e .` of arcpy:
 *   cc device_loop.c $(python -m arcpy.build_flags --cflags --libs) -o device_loop
 *
 * Captures one step (the scripted forward, then the sampler with its commit) into a graph,
 * enqueues a burst of 16 steps, and prints each token as it lands in the ring: no synchronize,
 * no copy per token, one poll loop that also watches the stream so that it cannot wait forever.
 *
 * Exit status: 0 when the 16 tokens are the scripted ones; 2 when there is no CUDA device (it
 * prints "no CUDA device: ..." on stderr); 1 on any other failure.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <time.h>

#include "arc_test.h" /* arc.h and the scripted model */

enum { VOCAB = 32000, STEPS = 16, TIMEOUT_S = 10, EXIT_NO_DEVICE = 2 };

/* One line on stderr for a failed call; the exit status it stands for. */
static int report(int status) {
    fprintf(stderr, "%s: %s\n", arc_status_string(status), arc_last_error());
    return status == ARC_NO_DEVICE ? EXIT_NO_DEVICE : 1;
}

#define CHECK(call)                               \
    do {                                          \
        int st_ = (call);                         \
        if (st_ != ARC_OK) return report(st_);    \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Waits for the stream to drain, polling with a short sleep: set-up and teardown only, never
 * per token. ARC_OK, the error the stream reported, or ARC_NOT_READY after TIMEOUT_S. */
static int wait_idle(arc_context *ctx) {
    const struct timespec nap = {0, 50 * 1000};
    const double deadline = now_s() + TIMEOUT_S;
    int st;
    while ((st = arc_stream_query(ctx)) == ARC_NOT_READY && now_s() < deadline) nanosleep(&nap, NULL);
    if (st == ARC_NOT_READY) fprintf(stderr, "the GPU was still busy after %d s\n", TIMEOUT_S);
    return st;
}

#define WAIT_IDLE(ctx)                                            \
    do {                                                          \
        int st_ = wait_idle(ctx);                                 \
        if (st_ == ARC_NOT_READY) return 1;                       \
        if (st_ != ARC_OK) return report(st_);                    \
    } while (0)

int main(void) {
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

    WAIT_IDLE(ctx);
    /* A new sequence: the ring reset, token 5 at position 0 as the first input. */
    arc_sequence seq = {0};
    seq.parts = ARC_SEQ_RESET_RING | ARC_SEQ_INPUT;
    seq.token = 5;
    seq.position = 0;
    CHECK(arc_loop_begin_sequence(loop, &seq));
    for (int i = 0; i < STEPS; ++i) CHECK(arc_loop_enqueue_step(loop, graph, 1));

    uint32_t seen = 0;
    long token = 5, position = 0;
    int mismatches = 0, idle_before = 0;
    const double deadline = now_s() + TIMEOUT_S;
    while (seen < STEPS) {
        arc_ring_state s;
        CHECK(arc_ring_poll(loop, &s));
        if (s.fault) {
            fprintf(stderr, "fault %u: token %d at position %d\n", s.fault, s.fault_token, s.fault_pos);
            return 1;
        }
        if (s.published == seen) {
            /* Nothing new. Once the stream was idle before a poll, nothing more can land. */
            if (idle_before) {
                fprintf(stderr, "the burst retired after %u of %d tokens\n", seen, STEPS);
                return 1;
            }
            if (now_s() > deadline) {
                fprintf(stderr, "no token for %d s (%u of %d)\n", TIMEOUT_S, seen, STEPS);
                return 1;
            }
            st = arc_stream_query(ctx);
            if (st != ARC_OK && st != ARC_NOT_READY) return report(st);
            idle_before = st == ARC_OK;
            continue;
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
    WAIT_IDLE(ctx);
    arc_graph_destroy(graph);
    arc_device_free(ctx, logits);
    arc_loop_destroy(loop);
    arc_context_destroy(ctx);
    return mismatches != 0;
}
