// argmax.cu -- the greedy sampler: the argmax, as a standalone entry point and, in the device
// loop's greedy step graph, with the commit in its last block. The draw (temperature, top-k,
// top-p) is sample.cu's.
#include <limits.h>

#include "commit.cuh"
#include "device_math.cuh"
#include "internal.cuh"
#include "launch.cuh"
#include "sample_math.cuh"

// --- Argmax ------------------------------------------------------------------------------

enum { ARGMAX_THREADS = 256, ARGMAX_PER_THREAD = 8 };

// True when (va, ia) should win over (vb, ib) under NumPy's argmax rule: NaN beats every
// number, the larger value wins, and equal values go to the lower index. ib == INT_MAX marks
// "no candidate yet".
__device__ __forceinline__ bool argmax_prefer(float va, int ia, float vb, int ib) {
    if (ib == INT_MAX) return ia != INT_MAX;
    if (ia == INT_MAX) return false;
    bool na = va != va, nb = vb != vb;
    if (na || nb) return na && (!nb || ia < ib);
    return va > vb || (va == vb && ia < ib);
}

// The block's best (v, i) and its largest `low` (~ of the smallest logit's key), in warp 0's
// lane 0.
__device__ __forceinline__ void argmax_block(float &v, int &i, uint32_t &low) {
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    __shared__ uint32_t sl[ARGMAX_THREADS / 32];
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, v, off);
        int oi = __shfl_down_sync(0xffffffffu, i, off);
        if (argmax_prefer(ov, oi, v, i)) { v = ov; i = oi; }
    }
    low = __reduce_max_sync(0xffffffffu, low);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { sv[warp] = v; si[warp] = i; sl[warp] = low; }
    __syncthreads();
    if (warp == 0) {
        v = lane < ARGMAX_THREADS / 32 ? sv[lane] : 0.0f;
        i = lane < ARGMAX_THREADS / 32 ? si[lane] : INT_MAX;
        low = lane < ARGMAX_THREADS / 32 ? sl[lane] : 0u;
        for (int off = 16; off > 0; off >>= 1) {
            float ov = __shfl_down_sync(0xffffffffu, v, off);
            int oi = __shfl_down_sync(0xffffffffu, i, off);
            if (argmax_prefer(ov, oi, v, i)) { v = ov; i = oi; }
        }
        low = __reduce_max_sync(0xffffffffu, low);
    }
}

// argmax(x[n]) -> *out, its value -> *value_out and the smallest logit -> *low_out (each when
// not null), or with commit, the token, its value and whether the two values meet -> commit_token. Grid: up to ARGMAX_MAX_BLOCKS blocks of ARGMAX_THREADS, each reducing a strided
// share to one partial; the last block to finish (done-counter ticket) reduces the partials and
// resets the counter, so one launch does both stages, and in the loop the commit too.

template <bool COMMIT>
__global__ void argmax_kernel(const float *__restrict__ x, int n, float *part_v, int *part_i,
                              uint32_t *part_low, unsigned *done, int32_t *out, float *value_out, float *low_out,
                              CommitArgs c) {
    float v = 0.0f;
    int i = INT_MAX;
    uint32_t low = 0;
    pdl_wait();  // the logits come from the kernel before
    // ARGMAX_PER_THREAD consecutive values per thread, all loaded before any is compared: one
    // memory round trip for a vocabulary of up to ARGMAX_MAX_BLOCKS * ARGMAX_THREADS * 8.
    const int stride = gridDim.x * blockDim.x * ARGMAX_PER_THREAD;
    for (int base = (blockIdx.x * blockDim.x + threadIdx.x) * ARGMAX_PER_THREAD; base < n; base += stride) {
        float xs[ARGMAX_PER_THREAD];
#pragma unroll
        for (int k = 0; k < ARGMAX_PER_THREAD; ++k) xs[k] = base + k < n ? x[base + k] : 0.0f;
#pragma unroll
        for (int k = 0; k < ARGMAX_PER_THREAD; ++k)
            if (base + k < n) {
                if (argmax_prefer(xs[k], base + k, v, i)) { v = xs[k]; i = base + k; }
                low = max(low, ~value_key(xs[k]));
            }
    }
    argmax_block(v, i, low);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        part_v[blockIdx.x] = v;
        part_i[blockIdx.x] = i;
        part_low[blockIdx.x] = low;
        __threadfence();
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    v = 0.0f;
    i = INT_MAX;
    low = 0;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
        float bv = ((volatile float *)part_v)[b];
        int bi = ((volatile int *)part_i)[b];
        if (argmax_prefer(bv, bi, v, i)) { v = bv; i = bi; }
        low = max(low, ((volatile uint32_t *)part_low)[b]);
    }
    argmax_block(v, i, low);
    if (threadIdx.x == 0) {
        *done = 0;
        if (COMMIT) {
            commit_token(c, i, v, value_key(v) == ~low);
        } else {
            if (value_out) *(volatile float *)value_out = v;
            if (low_out) *(volatile float *)low_out = key_value(~low);
            *(volatile int32_t *)out = i;
            __threadfence_system();
        }
    }
}

// Where the standalone argmax writes (arc_argmax); the committing one writes none of them.
struct ArgmaxResult {
    int32_t *out = nullptr;
    float *value_out = nullptr, *low_out = nullptr;
};

template <bool COMMIT>
static int launch_argmax(arc_context *ctx, const float *logits, int32_t n, const ArgmaxResult &o, CommitArgs c) {
    ARC_REQUIRE(logits, "null logits");
    ARC_REQUIRE(n > 0, "n must be positive, got %d", n);
    int blocks = (n + ARGMAX_THREADS * ARGMAX_PER_THREAD - 1) / (ARGMAX_THREADS * ARGMAX_PER_THREAD);
    if (blocks > ARGMAX_MAX_BLOCKS) blocks = ARGMAX_MAX_BLOCKS;
    // With programmatic dependence the sampler is scheduled while the lm_head finishes.
    return arc_launch_pdl(ctx, COMMIT ? "argmax_commit_kernel" : "argmax_kernel", argmax_kernel<COMMIT>,
                          dim3(blocks), dim3(ARGMAX_THREADS), 0, logits, n, ctx->argmax_vals, ctx->argmax_idx,
                          ctx->argmax_low, ctx->argmax_done, o.out, o.value_out, o.low_out, c);
}

extern "C" int arc_argmax(arc_context *ctx, const float *logits, int32_t n, int32_t *out, float *value_out,
                          float *low_out) {
    ARC_REQUIRE(ctx && out, "null argument");
    return launch_argmax<false>(ctx, logits, n, {.out = out, .value_out = value_out, .low_out = low_out},
                                CommitArgs{});
}

// Enqueues the argmax with the commit in its last block, reading logits[width]. Captured after
// the forward, it makes the greedy step graph that arc_loop_enqueue_step replays.
extern "C" int arc_loop_enqueue_sample_commit(arc_loop *loop, const float *logits, int32_t width) {
    ARC_REQUIRE(loop, "loop is null");
    ARC_REQUIRE(loop->vocab <= width, "loop vocab %d exceeds the logits' width %d", loop->vocab, width);
    arc_context *ctx = loop->ctx;
    int st = launch_argmax<true>(ctx, logits, width, ArgmaxResult{}, commit_args(loop));
    if (st == ARC_OK && ctx->capturing) ctx->capture_commits = loop;
    return st;
}
