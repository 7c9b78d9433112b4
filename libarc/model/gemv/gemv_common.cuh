// gemv_common.cuh -- what the bf16 GEMV (gemv.cu) and the quantized one (qgemv.cu) share: the
// work split by shape, and the end of a row task (the split-K sum,
// the epilogue that writes the rows, the argmax key of the lm_head).
#pragma once

#include "device_math.cuh"
#include "gemv.cuh"
#include "head_argmax.cuh"
#include "launch.cuh"

// GEMV_MIN_BLOCKS: blocks per SM the kernels are compiled to fit (their register budget), and so
// the occupancy the work split below plans for. Two leave room for the first batch of weights to
// be held in registers from before the dependency wait (at four it spills); measured on the
// H200, two with that early batch beat four without it on every benchmark shape (docs/PERF.md).
enum { GEMV_THREADS = 256, GEMV_WARPS = GEMV_THREADS / 32, GEMV_MIN_BLOCKS = 2, GEMV_LOADS = 8, GEMV_STAGE = 4 };

// The weight vectors of each row a lane loads in one batch: GEMV_LOADS loads over its NR rows.
constexpr int gemv_batch(int nr) { return nr >= GEMV_LOADS ? 1 : GEMV_LOADS / nr; }

// 8 inputs times inv times their 8 norm factors, add + the bf16 weights g (element 0 the low half
// of g.x; add is 1 where the factors are stored less one, else 0).
__device__ __forceinline__ void norm8(float4 &a, float4 &b, float inv, uint4 g, float add) {
    a.x = a.x * inv * (add + bf16_lo(g.x)); a.y = a.y * inv * (add + bf16_hi(g.x));
    a.z = a.z * inv * (add + bf16_lo(g.y)); a.w = a.w * inv * (add + bf16_hi(g.y));
    b.x = b.x * inv * (add + bf16_lo(g.z)); b.y = b.y * inv * (add + bf16_hi(g.z));
    b.z = b.z * inv * (add + bf16_lo(g.w)); b.w = b.w * inv * (add + bf16_hi(g.w));
}

// The weight rows of row task `task` (R output rows; GATED: their gate rows, then their up
// rows). A partial last task re-reads the last row; its result is never written.
template <int R, bool GATED>
__device__ __forceinline__ void task_rows(const uint4 *w, int task, int rows, int nvec,
                                          const uint4 *(&wr)[GATED ? 2 * R : R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = min(task * R + r, rows - 1);
        wr[r] = w + (size_t)row * nvec;
        if constexpr (GATED) wr[R + r] = w + ((size_t)rows + row) * nvec;
    }
}

// One batch: U vectors (stride `step`) of each of the NR rows, all loads issued before any use.
template <int NR, int U>
__device__ __forceinline__ void load_batch(const uint4 *const (&wr)[NR], int base, int step, int nvec,
                                           uint4 (&wt)[NR][U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int v = base + step * u;
#pragma unroll
        for (int r = 0; r < NR; ++r) wt[r][u] = v < nvec ? load_nc128(wr[r] + v) : make_uint4(0, 0, 0, 0);
    }
}

// A mixture of experts' product (moe.cu): which experts' rows a launch reads, chosen on the device.
// GATED: output row o of count * seg is row o % seg of expert e = ids[o / seg] (its gate row
// e * seg + o % seg, its up row `up` rows further), times scale[o / seg]. Not GATED: the input is
// count segments of seg columns, and row r's weights are segment j's row ids[j] * rows + r of a
// matrix of seg columns (the experts' down projections summed in one dot). ids null: expert 0 (a
// shared expert, whose outputs only take the scale); scale null: 1. A routed launch reads the
// experts after pdl_wait, never before (the router's kernel writes them in the same step).
enum { MOE_MAX_USED = 16 };  // the experts a token may use: n_experts_used <= MOE_MAX_USED
struct GemvRoute {
    const int32_t *ids;
    const float *scale;
    int count, seg, up;
};

// The block's copy of a route's experts and scales (shared memory, MOE_MAX_USED each), made by
// its first threads after pdl_wait; visible to all after the next barrier.
__device__ __forceinline__ void stage_route(const GemvRoute &rt, int *ids, float *scale) {
    const int t = threadIdx.x;
    if (t < rt.count) {
        ids[t] = rt.ids ? rt.ids[t] : 0;
        scale[t] = rt.scale ? rt.scale[t] : 1.0f;
    }
}

// The end of a row task of R output rows whose NR accumulators (GATED: the gate rows', then the
// up rows') each lane holds: the warp's sums, the KS warps' partial sums added in a fixed order
// (the result does not depend on timing), then the rows written: act(gate) * up (GATED: the
// `accumulate` slot carries the arc_activation; with seg_scale, times seg_scale[row / seg]), or the
// dot (+ bias) (+ y when accumulate). AM: the rows this lane wrote join what it has `seen`. With
// KS > 1 every warp of the block must call this, since it holds __syncthreads. WARPS: the block's.
// A routed product's biases (gpt-oss's experts; seg_ids: the block's staged experts, the route's
// `count` of them): GATED, expert e = seg_ids[row / seg] adds bias[e * seg + row % seg] to the gate
// and bias[up + e * seg + row % seg] to the up before the GLU; not GATED, row `row` of the summed
// experts' products adds seg_scale[j] * bias[seg_ids[j] * rows + row] for j in order of choice.
template <int R, int KS, bool GATED, bool AM, int NR, int WARPS = GEMV_WARPS>
__device__ __forceinline__ void gemv_finish_task(float (&acc)[NR], int task, int rows, const uint16_t *bias,
                                                 int accumulate, float *y, ArgmaxSeen &seen,
                                                 const float *seg_scale = nullptr, int seg = 1,
                                                 const int *seg_ids = nullptr, int count = 0, int up = 0) {
    __shared__ float part[WARPS][NR];  // the KS warps' partial sums
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = warp_sum(acc[r]);
    if constexpr (KS > 1) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < NR; ++r) part[warp][r] = acc[r];
        }
        __syncthreads();
        if (lane == 0 && warp % KS == 0) {
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                acc[r] = part[warp][r];
#pragma unroll
                for (int k = 1; k < KS; ++k) acc[r] += part[warp + k][r];
            }
        }
        __syncthreads();  // part is reused by the next task
    }
    if (lane == 0 && warp % KS == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int row = task * R + r;
            if (row >= rows) break;
            float out;
            if constexpr (GATED) {
                float gate = acc[r], upv = acc[R + r];
                if (bias != nullptr) {
                    const int at = (seg_ids ? seg_ids[row / seg] : 0) * seg + row % seg;
                    gate += bf16_to_f32(bias[at]);
                    upv += bf16_to_f32(bias[up + at]);
                }
                out = glu(gate, upv, accumulate);
                if (seg_scale != nullptr) out *= seg_scale[row / seg];
            } else {
                out = acc[r];
                if (bias != nullptr && seg_ids != nullptr) {
                    for (int j = 0; j < count; ++j)
                        out += seg_scale[j] * bf16_to_f32(bias[(size_t)seg_ids[j] * rows + row]);
                } else if (bias != nullptr) {
                    out += bf16_to_f32(bias[row]);
                }
                if (accumulate) out += y[row];
            }
            y[row] = out;
            if constexpr (AM) seen.see(out, row);
        }
    }
}

// The work split, by shape; only speed depends on it. Warp slots: the warps the GPU holds at
// the kernels' occupancy (GEMV_MIN_BLOCKS blocks per SM: 132 * 16 on an H200, where it was
// measured). Rows per task R: the most that still leaves a task for every other warp slot, so
// large matrices pay little per-row overhead. Split-K KS: when one row per task still leaves
// warp slots idle, split the row's `nvec` 16-byte vectors, as long as each warp keeps at least
// one full batch of loads.
static inline int gemv_split(const arc_context *ctx, int32_t rows, int32_t nvec, int max_r, bool gated, int *ks_out) {
    const int warp_slots = ctx->sm_count * GEMV_WARPS * GEMV_MIN_BLOCKS;
    const int r_slots = warp_slots / 2;
    int r = max_r;
    while (r > 1 && rows / r < r_slots) r /= 2;
    const int u = gemv_batch(gated ? 2 * r : r);
    const long long tasks = (rows + r - 1) / r;
    int ks = 1;
    if (r == 1)
        while (ks < 8 && tasks * ks < warp_slots && nvec >= 32 * u * ks * 2) ks *= 2;
    *ks_out = ks;
    return r;
}

// Rows of at most 32 * min(GEMV_WX, U) vectors (1,024 columns; 512 at 4 rows a task) may skip
// the block's staging: each warp holds the input in registers (gemv.cu: gemv_kernel's WX).
enum { GEMV_WX = 4 };

// The input vectors a lane holds under WX: one batch covers the row.
constexpr int gemv_wx_vectors(int nr) { return gemv_batch(nr) < GEMV_WX ? gemv_batch(nr) : GEMV_WX; }

// How a bf16 GEMV launch of a shape runs (gemv.cu): R rows a task, KS warps a task, and whether
// the input stays in registers (WX). KS fixes the order of each row's sum, and WX the order of the
// fused norm's sum of squares; the rows GEMV (gemv_rows.cu) follows both.
struct GemvPlan {
    int r, ks;
    bool wx;
};
static inline GemvPlan gemv_plan(const arc_context *ctx, int32_t rows, int32_t cols, bool gated) {
    int ks = 1;
    const int r = gemv_split(ctx, rows, cols / 8, gated ? 2 : 4, gated, &ks);
    return GemvPlan{r, ks, cols / 8 <= 32 * gemv_wx_vectors(gated ? 2 * r : r) && ks == 1};
}

// The limits every GEMV entry point shares, bf16 or quantized; `who` names it in the message.
static inline int check_gemv_io(const char *who, const void *w, const float *x, int32_t rows, int32_t cols,
                                const uint16_t *norm_w, float eps, const float *y) {
    ARC_REQUIRE_AS(who, w && x && y, "null pointer (w, x and y are required)");
    ARC_REQUIRE_AS(who, rows > 0, "rows must be positive, got %d", rows);
    ARC_REQUIRE_AS(who, cols <= GEMV_MAX_COLS, "cols %d exceeds the limit %d", cols, GEMV_MAX_COLS);
    ARC_REQUIRE_AS(who, (uintptr_t)w % 16 == 0, "weights must be 16-byte aligned");
    ARC_REQUIRE_AS(who, (uintptr_t)x % 16 == 0, "x must be 16-byte aligned");
    ARC_REQUIRE_AS(who, norm_w == nullptr || (uintptr_t)norm_w % 16 == 0, "norm weights must be 16-byte aligned");
    ARC_REQUIRE_AS(who, norm_w == nullptr || eps > 0.0f, "eps must be positive, got %g", (double)eps);
    ARC_REQUIRE_AS(who, (const void *)y != (const void *)x, "y must not alias x");
    return ARC_OK;
}

// The grid of a GEMV launch of `kernel` (R rows a task, KS warps a task, `smem` bytes of dynamic
// shared memory, `threads` a block): enough blocks to keep every SM at the kernel's occupancy limit, but no more
// than there is work (so every block has a task). Above 48 KiB with the kernels' static shared
// memory (under 1 KiB) the launch needs the opt-in: a host-side attribute, legal while capturing.
template <typename Kernel>
static int gemv_blocks(arc_context *ctx, Kernel kernel, size_t smem, int32_t rows, int r, int ks, int *blocks,
                       int threads = GEMV_THREADS) {
    if (smem + 1024 > 48 * 1024)
        ARC_CUDA(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    ARC_CUDA(ctx, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    if (per_sm < 1) per_sm = 1;
    const long long groups = threads / 32 / ks;
    const long long needed = ((rows + r - 1) / r + groups - 1) / groups;
    const long long most = (long long)ctx->sm_count * per_sm;
    *blocks = (int)(needed < most ? needed : most);
    return ARC_OK;
}
