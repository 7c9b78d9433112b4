// logprobs.cu -- the log-probabilities of the device loop: for the token a step published, its
// log-probability under log_softmax(logits[0..vocab)) and the top_n most likely ids and theirs,
// written into a pinned, mapped ring beside the token slots, so the host reads them as it reads
// tokens (arc.h: arc_loop_enqueue_logprobs).
//
// One launch, two stages. Each block takes LP_SLICE consecutive logits into registers, reduces
// them to its maximum m and sum of exp(x - m), and picks its own top_n by top_n rounds of a block
// argmax (the larger value, then the lower id), then writes these partials. The last block to
// finish (a done-counter ticket) merges them: log Z = M + log(sum of s_b exp(m_b - M)), the top_n
// of the blocks' candidates by the same rounds, and the chosen token's logit minus log Z. It
// publishes the entry as the commit publishes a token: the entry first, a system-wide fence, then
// the count. A step whose commit published nothing (a fault, a stop id earlier in the burst, the
// burst's limit) leaves the count where it was: every block sees that and returns.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "device_math.cuh"
#include "internal.cuh"
#include "launch.cuh"

enum { LP_THREADS = 256, LP_PER_THREAD = 8, LP_SLICE = LP_THREADS * LP_PER_THREAD, LP_MAX_BLOCKS = 1024 };
// A block's partials: max, sum, then ARC_MAX_TOP_LOGPROBS values and ids (ids as float bits).
enum { LP_PART = 2 + 2 * ARC_MAX_TOP_LOGPROBS };

// Whether (va, ia) ranks before (vb, ib): the larger value, ties to the lower id; ib < 0 is none.
__device__ __forceinline__ bool lp_before(float va, int ia, float vb, int ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return false;
    return va > vb || (va == vb && ia < ib);
}

// The block's best (v, i) by lp_before, returned to every thread.
__device__ float lp_best(float v, int i, int *best_i) {
    __shared__ float sv[LP_THREADS / 32];
    __shared__ int si[LP_THREADS / 32];
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, v, off);
        int oi = __shfl_down_sync(0xffffffffu, i, off);
        if (lp_before(ov, oi, v, i)) { v = ov; i = oi; }
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // the shared slots are free (an earlier call's readers are done)
    if (lane == 0) { sv[warp] = v; si[warp] = i; }
    __syncthreads();
    v = sv[0];
    i = si[0];
    for (int w = 1; w < LP_THREADS / 32; ++w)
        if (lp_before(sv[w], si[w], v, i)) { v = sv[w]; i = si[w]; }
    *best_i = i;
    return v;
}

// The block's sum of v (every thread gets it).
__device__ float lp_sum(float v) {
    __shared__ float ss[LP_THREADS / 32];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    __syncthreads();
    if (threadIdx.x % 32 == 0) ss[threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < LP_THREADS / 32; ++w) total += ss[w];
    return total;
}

// The partials of one slice of logits[0..vocab) (LP_SLICE logits from slice * LP_SLICE), by a
// whole block: their maximum m, the sum of exp(x - m), then their top_n (value, id as float bits)
// by top_n rounds of a block argmax; written to part (LP_PART floats) by thread 0.
__device__ void lp_slice(const float *logits, int vocab, int top_n, int slice, float *part) {
    const int first = slice * LP_SLICE;
    float xs[LP_PER_THREAD];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < LP_PER_THREAD; ++k) {
        const int id = first + k * LP_THREADS + threadIdx.x;
        xs[k] = id < vocab ? logits[id] : -INFINITY;
        m = fmaxf(m, xs[k]);
    }
    int unused;
    m = lp_best(m, 0, &unused);
    float s = 0.0f;
    if (m > -INFINITY) {
#pragma unroll
        for (int k = 0; k < LP_PER_THREAD; ++k) s += expf(xs[k] - m);
    }
    s = lp_sum(s);
    unsigned taken = 0;  // bit k: xs[k] was picked
    for (int r = 0; r < top_n; ++r) {
        float v = 0.0f;
        int i = -1;
#pragma unroll
        for (int k = 0; k < LP_PER_THREAD; ++k) {
            const int id = first + k * LP_THREADS + threadIdx.x;
            if (id < vocab && !(taken >> k & 1u) && lp_before(xs[k], id, v, i)) { v = xs[k]; i = id; }
        }
        int bi;
        const float bv = lp_best(v, i, &bi);
        if (bi >= 0 && (bi - first) % LP_THREADS == (int)threadIdx.x) taken |= 1u << ((bi - first) / LP_THREADS);
        if (threadIdx.x == 0) {
            part[2 + 2 * r] = bv;
            part[3 + 2 * r] = __int_as_float(bi);
        }
    }
    if (threadIdx.x == 0) {
        part[0] = m;
        part[1] = s;
    }
}

// The merge of `blocks` slices' partials, by a whole block: log Z = M + log(sum of s_b exp(m_b -
// M)), returned to every thread, and the top_n of the slices' candidates by the same rounds (a
// picked one's id struck out of parts), written by thread 0 to top_ids and top_values[0..top_n)
// as values minus log Z (id -1 and -inf where the vocabulary has fewer ids).
__device__ float lp_merge(float *parts, int blocks, int top_n, int32_t *top_ids, float *top_values) {
    volatile float *vp = parts;  // another block may have written them (after a fence)
    int unused;
    float big = -INFINITY;
    for (int b = threadIdx.x; b < blocks; b += LP_THREADS) big = fmaxf(big, vp[(size_t)b * LP_PART]);
    big = lp_best(big, 0, &unused);
    float total = 0.0f;
    for (int b = threadIdx.x; b < blocks; b += LP_THREADS) {
        const float mb = vp[(size_t)b * LP_PART];
        if (mb > -INFINITY) total += vp[(size_t)b * LP_PART + 1] * expf(mb - big);
    }
    total = lp_sum(total);
    const float log_z = big + logf(total);
    for (int r = 0; r < top_n; ++r) {
        float v = 0.0f;
        int i = -1, at = -1;
        for (int c = threadIdx.x; c < blocks * top_n; c += LP_THREADS) {
            const size_t o = (size_t)(c / top_n) * LP_PART + 2 + 2 * (c % top_n);
            const int id = __float_as_int(vp[o + 1]);
            const float cv = vp[o];
            if (id >= 0 && lp_before(cv, id, v, i)) { v = cv; i = id; at = (int)o; }
        }
        int bi;
        const float bv = lp_best(v, i, &bi);
        if (bi >= 0 && bi == i && at >= 0) vp[at + 1] = __int_as_float(-1);
        if (threadIdx.x == 0) {
            top_ids[r] = bi;
            top_values[r] = bi >= 0 ? bv - log_z : -INFINITY;
        }
        __syncthreads();  // the strike is visible before the next round reads
    }
    return log_z;
}

struct LogprobArgs {
    const float *logits;
    int vocab, capacity;
    DeviceState *st;
    RingHeader *ring;
    LogprobRing out;
    float *part;
    uint32_t *done;
};

__global__ void __launch_bounds__(LP_THREADS) logprobs_kernel(LogprobArgs a) {
    pdl_wait();  // the logits and the commit's count come from the kernels before
    DeviceState *st = a.st;
    const uint32_t entry = st->logprobs;
    if (st->published <= entry) return;  // this step's commit published no token
    const int top_n = st->top_logprobs;
    lp_slice(a.logits, a.vocab, top_n, blockIdx.x, a.part + (size_t)blockIdx.x * LP_PART);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(a.done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const uint32_t slot = entry % (uint32_t)a.capacity;
    const float log_z = lp_merge(a.part, gridDim.x, top_n, a.out.top_ids + (size_t)slot * ARC_MAX_TOP_LOGPROBS,
                                 a.out.top_values + (size_t)slot * ARC_MAX_TOP_LOGPROBS);
    if (threadIdx.x == 0) {
        a.out.logprob[slot] = a.logits[st->token] - log_z;
        *a.done = 0;
        __threadfence_system();
        a.ring->logprobs = entry + 1;
        st->logprobs = entry + 1;
    }
}

// Rows of logits scored against their targets (the prompt's own log-probabilities, prefill.cu):
// row r's slices, then its merge, each row on its own.
struct RowLogprobArgs {
    const float *logits;
    int64_t stride;
    int vocab, top_n, slices;
    float *part;
    const int32_t *targets;
    float *logprob;
    int32_t *top_ids;
    float *top_values;
};

__global__ void __launch_bounds__(LP_THREADS) row_slices_kernel(RowLogprobArgs a) {
    pdl_wait();  // the logits come from the product before
    const size_t row = blockIdx.y;
    lp_slice(a.logits + row * a.stride, a.vocab, a.top_n, blockIdx.x,
             a.part + (row * a.slices + blockIdx.x) * LP_PART);
}

__global__ void __launch_bounds__(LP_THREADS) row_merge_kernel(RowLogprobArgs a) {
    pdl_wait();
    const size_t row = blockIdx.x;
    const float log_z = lp_merge(a.part + row * a.slices * LP_PART, a.slices, a.top_n,
                                 a.top_ids + row * ARC_MAX_TOP_LOGPROBS, a.top_values + row * ARC_MAX_TOP_LOGPROBS);
    if (threadIdx.x == 0) {
        const int t = a.targets[row];
        a.logprob[row] = t >= 0 && t < a.vocab ? a.logits[row * a.stride + t] - log_z : NAN;
    }
}

extern "C" int arc_op_row_logprobs_scratch_bytes(int32_t rows, int32_t vocab, uint64_t *bytes) {
    ARC_REQUIRE(bytes, "null argument");
    ARC_REQUIRE(rows >= 1 && vocab >= 1, "rows and vocab must be positive, got %d and %d", rows, vocab);
    *bytes = (uint64_t)rows * ((vocab + LP_SLICE - 1) / LP_SLICE) * LP_PART * sizeof(float);
    return ARC_OK;
}

extern "C" int arc_op_row_logprobs(arc_context *ctx, const float *logits, int32_t rows, int64_t stride,
                                   int32_t vocab, int32_t top_n, const int32_t *targets, float *scratch,
                                   float *logprob, int32_t *top_ids, float *top_values) {
    ARC_REQUIRE(ctx && logits && targets && scratch && logprob && top_ids && top_values, "null argument");
    ARC_REQUIRE(rows >= 1 && rows <= 65535, "rows must be in 1..65535, got %d", rows);
    ARC_REQUIRE(vocab >= 1 && vocab <= stride, "vocab %d must be in 1..stride %lld", vocab, (long long)stride);
    ARC_REQUIRE(top_n >= 0 && top_n <= ARC_MAX_TOP_LOGPROBS, "top_n must be in 0..%d, got %d", ARC_MAX_TOP_LOGPROBS,
                top_n);
    const int slices = (vocab + LP_SLICE - 1) / LP_SLICE;
    const RowLogprobArgs a{logits, stride, vocab, top_n, slices, scratch, targets, logprob, top_ids, top_values};
    ARC_TRY(arc_launch_pdl(ctx, "row_slices_kernel", row_slices_kernel, dim3(slices, rows), dim3(LP_THREADS), 0, a));
    return arc_launch_pdl(ctx, "row_merge_kernel", row_merge_kernel, dim3(rows), dim3(LP_THREADS), 0, a);
}

__global__ void set_logprobs_kernel(DeviceState *st, int32_t top_n) { st->top_logprobs = top_n; }

static int logprobs_alloc(arc_loop *loop) {
    arc_context *ctx = loop->ctx;
    const size_t cap = (size_t)loop->capacity, top = cap * ARC_MAX_TOP_LOGPROBS;
    const size_t bytes = cap * sizeof(float) + top * (sizeof(int32_t) + sizeof(float));
    void *h = nullptr, *d = nullptr;
    ARC_CUDA(ctx, cudaHostAlloc(&h, bytes, cudaHostAllocMapped));
    loop->lp_host = h;
    memset(h, 0, bytes);
    ARC_CUDA(ctx, cudaHostGetDevicePointer(&d, h, 0));
    auto carve = [&](char *base) {
        return LogprobRing{(float *)base, (int32_t *)(base + cap * sizeof(float)),
                           (float *)(base + cap * sizeof(float) + top * sizeof(int32_t))};
    };
    loop->lp_ring_host = carve((char *)h);
    loop->lp_ring_dev = carve((char *)d);
    const int blocks = (loop->vocab + LP_SLICE - 1) / LP_SLICE;
    ARC_CUDA(ctx, cudaMalloc(&loop->lp_part, (size_t)blocks * LP_PART * sizeof(float)));
    ARC_CUDA(ctx, cudaMalloc(&loop->lp_done, sizeof(uint32_t)));
    ARC_CUDA(ctx, cudaMemsetAsync(loop->lp_done, 0, sizeof(uint32_t), ctx->stream));
    return ARC_OK;
}

// The sequence's log-probability alternatives (arc_loop_begin_sequence, ARC_SEQ_LOGPROBS).
int loop_set_logprobs(arc_loop *loop, int32_t top_n) {
    ARC_REQUIRE(top_n >= 0 && top_n <= ARC_MAX_TOP_LOGPROBS, "top_n must be in 0..%d, got %d", ARC_MAX_TOP_LOGPROBS,
                top_n);
    ARC_REQUIRE((loop->vocab + LP_SLICE - 1) / LP_SLICE <= LP_MAX_BLOCKS, "vocab %d is too large for the "
                "log-probabilities (at most %d)", loop->vocab, LP_MAX_BLOCKS * LP_SLICE);
    arc_context *ctx = loop->ctx;
    ARC_REQUIRE(!ctx->capturing, "not while capturing: the first call allocates the ring");
    if (!loop->lp_host) ARC_TRY(logprobs_alloc(loop));
    set_logprobs_kernel<<<1, 1, 0, ctx->stream>>>(loop->state, top_n);
    ARC_LAUNCHED(ctx, "set_logprobs_kernel");
    return ARC_OK;
}

extern "C" int arc_loop_enqueue_logprobs(arc_loop *loop, const float *logits, int32_t width) {
    ARC_REQUIRE(loop && logits, "null argument");
    ARC_REQUIRE(loop->vocab <= width, "loop vocab %d exceeds the logits' width %d", loop->vocab, width);
    ARC_REQUIRE(loop->lp_host, "no log-probability ring: begin a sequence with ARC_SEQ_LOGPROBS first");
    arc_context *ctx = loop->ctx;
    const LogprobArgs a{logits, loop->vocab, loop->capacity, loop->state, loop->ring_dev, loop->lp_ring_dev,
                        loop->lp_part, loop->lp_done};
    const int blocks = (loop->vocab + LP_SLICE - 1) / LP_SLICE;
    return arc_launch_pdl(ctx, "logprobs_kernel", logprobs_kernel, dim3(blocks), dim3(LP_THREADS), 0, a);
}

extern "C" int arc_ring_read_logprobs(arc_loop *loop, uint32_t first, uint32_t count, float *logprob,
                                      int32_t *top_ids, float *top_values) {
    ARC_REQUIRE(loop && ((logprob && top_ids && top_values) || count == 0), "null argument");
    ARC_REQUIRE(loop->lp_host || count == 0, "no log-probability ring: begin a sequence with ARC_SEQ_LOGPROBS first");
    const uint32_t written = loop->ring_host->logprobs;
    std::atomic_thread_fence(std::memory_order_acquire);
    ARC_REQUIRE((uint64_t)first + count <= written, "entries [%u, %u) are not written yet (%u)", first,
                first + count, written);
    ARC_REQUIRE(written - first <= (uint32_t)loop->capacity, "entry %u was overwritten (ring capacity %d)", first,
                loop->capacity);
    const LogprobRing &r = loop->lp_ring_host;
    for (uint32_t k = 0; k < count; ++k) {
        const size_t slot = (first + k) % (uint32_t)loop->capacity;
        logprob[k] = ((volatile float *)r.logprob)[slot];
        const size_t from = slot * ARC_MAX_TOP_LOGPROBS, to = (size_t)k * ARC_MAX_TOP_LOGPROBS;
        for (int j = 0; j < ARC_MAX_TOP_LOGPROBS; ++j) {
            top_ids[to + j] = ((volatile int32_t *)r.top_ids)[from + j];
            top_values[to + j] = ((volatile float *)r.top_values)[from + j];
        }
    }
    return ARC_OK;
}
