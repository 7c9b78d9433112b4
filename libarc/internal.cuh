// internal.cuh -- what libarc's sources share and users never see: the handle structs, the
// per-thread error record, and the macros that check every CUDA call and every launch.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "arc_ops.h"   // arc.h and the kernel entry points
#include "arc_test.h"  // and the test hooks

// Records a failure for arc_last_error() and returns its status. `what` names the entry point
// or call; the message says what was wrong. Never exits, never throws.
int arc_fail(int status, const char *what, const char *fmt, ...);
// Records a failed CUDA call (its error name and string) and maps it to a status.
int arc_fail_cuda(cudaError_t err, const char *call, const char *where);

// Sizes of the context's scratch: partials of the two-stage argmax (one per block), and the
// attention kernel's tickets (one per query head).
enum { ARGMAX_MAX_BLOCKS = 264, ARC_ATTN_MAX_GROUPS = 1024 };

// The draw kernel's grid-wide scratch (sample.cu): three rotating radix histograms (counts and
// integer masses), the per-block sums of its ordered searches, the grid barrier, and the results
// every block reads. The draw leaves it as it found it (histogram 0 and the maximum zero).
enum { DRAW_BINS = 2048, DRAW_MAX_BLOCKS = 1024 };
struct DrawScratch {
    unsigned long long mass[3][DRAW_BINS];
    uint32_t count[3][DRAW_BINS];
    unsigned long long block_sum[DRAW_MAX_BLOCKS];
    uint32_t max_key;
    uint32_t low_key;     // the largest ~key: the smallest logit's
    uint32_t bar_count;   // arrivals at the grid barrier during this launch
    uint32_t exit_count;
    int32_t found;
};

#ifdef __CUDACC__  // device code only: core.cu and graph.cu compile as C++
// A quiet NaN: what a kernel writes where it has no value to give, so that the commit's
// non-finite check latches it.
__device__ __forceinline__ float quiet_nan() { return __uint_as_float(0x7fc00000u); }
#endif

// What the blocks of an lm_head GEMV that takes the argmax share (model/head_argmax.cuh).
struct HeadArgmax {
    unsigned long long best;  // the largest (order key << 32 | ~row) so far; 0: none
    uint32_t low;             // the largest ~(order key) so far: the smallest logit's; 0: none
    uint32_t done;            // blocks finished
};

// The quantized input the handoff holds: up to 49,152 values (GEMV_MAX_COLS) in units of 32, each
// 32 int8 values, the sums of their halves and their scale (qinput.cuh's staging layout).
enum { ARC_HANDOFF_UNITS = 49152 / 32, ARC_HANDOFF_UNIT_BYTES = 32 + 8 + 4 };

struct arc_context {
    int device;
    // Read once, in context_init: launchers size their grids by the multiprocessor count, and
    // compute capability 9.0 or more launches the forward with programmatic dependence.
    int sm_count;
    int cc_major;
    cudaStream_t stream;
    arc_counters counters;
    bool capturing;
    arc_loop *capture_commits;  // the loop whose commit the capture in progress holds, if any
    // Scratch for the two-stage argmax: per-block partial results and a done-counter.
    float *argmax_vals;
    int32_t *argmax_idx;
    uint32_t *argmax_low;  // ~(order key) of each block's smallest logit
    uint32_t *argmax_done;
    // The lm_head's argmax (arc_model_forward_commit, arc_op_gemv_argmax): the best order key so
    // far and the blocks' ticket; both zero between launches.
    HeadArgmax *head_argmax;
    // Tickets of the attention kernel's heads: the last block of a head combines its partials.
    uint32_t *attn_done;
    // The SwiGLU GEMV's output handed to the down GEMV already quantized (qgemv.cuh: the handoff):
    // ARC_HANDOFF_UNITS units of ARC_HANDOFF_UNIT_BYTES, and a ticket per unit, zero between launches.
    uint8_t *handoff;
    uint32_t *handoff_done;
    // The draw's histograms, block sums and grid barrier; zero between launches.
    DrawScratch *draw;
    // Blocks of the cluster the draw runs in, by ids per thread (4, 8) and commit or not
    // (arc_draw_init); 0 where the cluster draw does not run.
    int draw_cluster[2][2];
    arc_comm *comm;  // tensor parallelism: this rank's communicator (comm.cu); null: the model is whole
};

// A split model's o and down products add the residual on rank 0 alone, then sum over the ranks
// (comm.cu): the rank (0 without a communicator), and the sum of n floats in place (nothing without).
int comm_rank(const arc_context *ctx);
int comm_sum(arc_context *ctx, float *x, int64_t n);

// Sets the draw kernels' attributes and finds the cluster they run in, once per context.
int arc_draw_init(arc_context *ctx);

// The parts of arc_loop_begin_sequence written in other files (draw.cu, logprobs.cu, logit_bias.cu): each checks
// its arguments and enqueues its stream-ordered write of the loop's DeviceState.
int loop_set_sampling(arc_loop *loop, const arc_sampling *sampling);
int loop_set_logprobs(arc_loop *loop, int32_t top_n);
int loop_set_logit_bias(arc_loop *loop, const int32_t *ids, const float *values, int32_t n);

struct arc_graph {
    arc_context *ctx;
    cudaGraphExec_t exec;
    arc_loop *commits;  // a step graph: the loop its sample-and-commit belongs to
    uint64_t node_count;
};

// The fields the commit kernel publishes and the host polls. Lives in pinned host memory that
// is mapped into the device; the device keeps its own copy of the counters (DeviceState) so
// that it never reads host memory across the bus on the step path.
struct RingHeader {
    volatile uint32_t published;
    volatile uint32_t fault;
    volatile int32_t fault_token;
    volatile int32_t fault_pos;
    volatile uint32_t stopped;
    volatile uint32_t steps;  // speculative steps whose commit ran
    volatile uint32_t logprobs;  // log-probability entries written (logprobs.cu), at most `published`
};

struct DeviceState {
    int32_t position;     // the position the next forward runs at
    uint32_t token;       // the token the next forward reads
    uint32_t published;   // device copy of RingHeader::published
    uint32_t fault;       // device copy of RingHeader::fault (sticky)
    uint32_t stopped;     // burst id a stop id ended
    uint32_t burst;       // the burst the next commits belong to
    uint32_t limit;       // the published count at which this burst stops publishing
    uint32_t steps;       // device copy of RingHeader::steps
    int32_t lose_in;      // fault injection: commits until a lost one, -1 when disarmed
    int32_t n_stop_ids;
    int32_t stop_ids[ARC_MAX_STOP_IDS];
    // The sampled step graph's parameters (arc_loop_begin_sequence, ARC_SEQ_SAMPLING), in the draw's own terms.
    float inv_temperature;
    int32_t top_k;        // 0: off
    uint64_t top_p32;     // top_p in units of 2^-32; 2^32: off
    uint64_t seed;
    uint32_t logprobs;    // device copy of RingHeader::logprobs
    int32_t top_logprobs; // alternatives each entry lists (ARC_SEQ_LOGPROBS)
    int32_t n_bias;       // the logit bias (ARC_SEQ_LOGIT_BIAS): pairs in use
    int32_t bias_ids[ARC_MAX_LOGIT_BIAS];
    float bias_values[ARC_MAX_LOGIT_BIAS];
    int32_t memory;       // the drafts' memory (ARC_SEQ_DRAFT_MEMORY): ids before history[0], separator included
};

// The log-probability ring (logprobs.cu): pinned and mapped, one entry beside each token slot,
// and the per-block partials of the kernel that writes them (device memory).
struct LogprobRing {
    float *logprob;       // [capacity]
    int32_t *top_ids;     // [capacity][ARC_MAX_TOP_LOGPROBS]
    float *top_values;    // [capacity][ARC_MAX_TOP_LOGPROBS]
};

struct arc_loop {
    arc_context *ctx;
    int32_t vocab;
    int32_t max_seq;
    int32_t capacity;
    uint32_t burst;       // the burst id last enqueued
    // Pinned, mapped: the ring header followed by `capacity` token slots.
    RingHeader *ring_host;
    RingHeader *ring_dev;
    int32_t *slots_host;
    int32_t *slots_dev;
    DeviceState *state;   // device memory
    int32_t *history;     // device memory, max_seq token ids: the token at each position, preceded by
                          // ARC_DRAFT_MEMORY ids of the drafts' memory (history[-ARC_DRAFT_MEMORY..-1])
    void *lp_host;        // the log-probability ring's pinned block, null until the first ARC_SEQ_LOGPROBS
    LogprobRing lp_ring_host, lp_ring_dev;
    float *lp_part;       // device: per block, max, sum and ARC_MAX_TOP_LOGPROBS (value, id) candidates
    uint32_t *lp_done;    // device: the kernel's done counter
    uint32_t *mask_host;  // the mask block (mask.cu), pinned and mapped: the ready word, then the mask's
    uint32_t *mask_dev;   // words; null until arc_loop_mask_block
};

// Every CUDA call on a context goes through one of these: counted, checked, and on failure
// recorded with the call's text and the entry point, then returned as a status.
#define ARC_CUDA(ctx, call)                                                        \
    do {                                                                           \
        if (ctx) (ctx)->counters.cuda_calls++;                                     \
        cudaError_t arc_err_ = (call);                                             \
        if (arc_err_ != cudaSuccess) return arc_fail_cuda(arc_err_, #call, __func__); \
    } while (0)

// After each kernel launch: the launch itself may have failed (bad configuration, a sticky
// error from earlier work). cudaGetLastError is what reports it.
#define ARC_LAUNCHED(ctx, name)                                                    \
    do {                                                                           \
        (ctx)->counters.kernel_launches++;                                         \
        (ctx)->counters.cuda_calls++;                                              \
        cudaError_t arc_err_ = cudaGetLastError();                                 \
        if (arc_err_ != cudaSuccess) return arc_fail_cuda(arc_err_, name, __func__); \
    } while (0)

#define ARC_REQUIRE(cond, ...) ARC_REQUIRE_AS(__func__, cond, __VA_ARGS__)
// The same, reported as entry point `who` (a helper that serves several entry points).
#define ARC_REQUIRE_AS(who, cond, ...)                                             \
    do {                                                                           \
        if (!(cond)) return arc_fail(ARC_INVALID_ARGUMENT, who, __VA_ARGS__);     \
    } while (0)

