// qgemv.cuh -- the GEMV over quantized weights (arc.h's arc_format), the decode's products for a
// model held in GGUF's block formats. Same work split, same epilogues and same launch as the
// bf16 GEMV (gemv_common.cuh: bias, residual, SwiGLU, the lm_head's argmax and commit); only
// the inner product differs: the weights stay packed in registers and meet an int8 copy of the
// input in dp4a instructions (quant.cuh), so a 4-bit weight costs about half an instruction.
//
// Each block stages the input once (qinput.cuh): normed and quantized, or handed over from the
// SwiGLU GEMV. Each lane then walks units lane, lane + 32 * KS, ... of its task's rows, a batch of
// loads in flight at a time. Instances live in qgemv_*.cu, a few formats a file, so that nvcc
// compiles them in parallel.
#pragma once

#include "model/gemv/gemv_common.cuh"
#include "qinput.cuh"

// Units a lane keeps in flight per batch, over its NR rows: 4 (a unit is 16 or 32 bytes of quants
// plus its scales; with 8, and the first batch held through the staging, the kernels spill).
constexpr int QGEMV_UNITS = 4;
constexpr int qgemv_batch(int nr) { return QGEMV_UNITS / nr > 0 ? QGEMV_UNITS / nr : 1; }

// The rows of task `task`: R output rows (GATED: their gate rows, then their up rows), as row
// indices; a row lies at w + index * row_bytes. A partial last task re-reads the last row; its
// result is never written. (An index and one multiply-add per load cost fewer registers than a
// 64-bit pointer per row.)
template <int R, bool GATED>
__device__ __forceinline__ void qtask_rows(int task, int rows, uint32_t (&rix)[GATED ? 2 * R : R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = min(task * R + r, rows - 1);
        rix[r] = (uint32_t)row;
        if constexpr (GATED) rix[R + r] = (uint32_t)(rows + row);
    }
}

// Where unit u's arrays lie in row 0 (quants, high bits, scales, Q6_K's d); a row adds its
// offset. The units of a batch, u + STEP * k, lie at fixed distances from these (STEP is a
// multiple of 32, so of the 8 units of a superblock), which the loads below add as constants.
struct UnitAddr {
    const uint8_t *q, *b, *c, *d;
};

template <int F>
__device__ __forceinline__ UnitAddr unit_addr(const uint8_t *w, const RowLayout &L, uint32_t u) {
    UnitAddr a;
    a.q = w + (F == ARC_FORMAT_Q8_0 ? 32u : format_two_bit(F) ? 8u : 16u) * u;
    a.b = w + L.b + (format_h32(F) ? 4u : 8u) * u;
    // Q4_0, Q8_0, Q5_0, IQ4_NL: 2u; Q4_1, Q5_1: 4u; Q4_K, Q5_K: 16 (u / 8); Q6_K: 16 (u / 8) + 2 (u % 8)
    // = 2u (Q3_K, Q2_K too); MXFP4, IQ4_XS: u
    a.c = w + L.c + (F == ARC_FORMAT_Q4_1 || F == ARC_FORMAT_Q5_1              ? 4u * u
                     : F == ARC_FORMAT_Q4_K || F == ARC_FORMAT_Q5_K            ? 16u * (u / 8)
                     : F == ARC_FORMAT_MXFP4 || F == ARC_FORMAT_IQ4_XS ? u
                                                                               : 2u * u);
    a.d = w + L.d + (F == ARC_FORMAT_Q2_K ? 4u : 2u) * (u / 8);
    return a;
}

// The two parts of quant.cuh's load_unit for unit u + STEP * k of the row at offset `ro`, with
// `a` = unit_addr(u): its quants, then the rest (high bits and scales). Every load issued, none used.
template <int F, int STEP>
__device__ __forceinline__ void load_quants_at(const UnitAddr &a, size_t ro, int k, UnitRaw &r) {
    if constexpr (F == ARC_FORMAT_Q8_0) {
        r.q0 = load_nc128(a.q + ro + 32 * STEP * k);
        r.q1 = load_nc128(a.q + ro + 32 * STEP * k + 16);
    } else if constexpr (format_two_bit(F)) {
        const uint2 q = load_nc64(a.q + ro + 8 * STEP * k);
        r.q0.x = q.x;
        r.q0.y = q.y;
    } else {
        r.q0 = load_nc128(a.q + ro + 16 * STEP * k);
    }
}

template <int F, int STEP>
__device__ __forceinline__ void load_rest_at(const UnitAddr &a, size_t ro, int k, UnitRaw &r) {
    if constexpr (format_h32(F)) r.hb.x = load_nc32(a.b + ro + 4 * STEP * k);
    if constexpr (F == ARC_FORMAT_Q6_K) r.hb = load_nc64(a.b + ro + 8 * STEP * k);
    if constexpr (F == ARC_FORMAT_Q8_0 || F == ARC_FORMAT_Q4_0 || F == ARC_FORMAT_Q5_0 || F == ARC_FORMAT_IQ4_NL)
        r.s.x = load_nc16(a.c + ro + 2 * STEP * k);
    if constexpr (F == ARC_FORMAT_Q4_1 || F == ARC_FORMAT_Q5_1) r.s.x = load_nc32(a.c + ro + 4 * STEP * k);
    if constexpr (F == ARC_FORMAT_MXFP4 || F == ARC_FORMAT_IQ4_XS) r.s.x = load_nc8(a.c + ro + STEP * k);
    if constexpr (F == ARC_FORMAT_IQ4_XS) r.s.y = load_nc16(a.d + ro + STEP / 4 * k);
    if constexpr (F == ARC_FORMAT_Q4_K || F == ARC_FORMAT_Q5_K) r.s = load_nc128(a.c + ro + 2 * STEP * k);
    if constexpr (F == ARC_FORMAT_Q6_K || F == ARC_FORMAT_Q3_K) {
        r.s.x = load_nc16(a.c + ro + 2 * STEP * k);
        r.s.y = load_nc16(a.d + ro + STEP / 4 * k);
    }
    if constexpr (F == ARC_FORMAT_Q2_K) {
        r.s.x = load_nc16(a.c + ro + 2 * STEP * k);
        r.s.y = load_nc32(a.d + ro + STEP / 2 * k);
    }
}

// The row offset of row index `ri`.
__device__ __forceinline__ size_t qrow_offset(uint32_t ri, uint32_t row_bytes) { return (size_t)ri * row_bytes; }

// acc[r] += the dots of a full batch of units (U of them, base + STEP * u, all < units) of NR rows.
template <int F, int NR, int U, int STEP>
__device__ __forceinline__ void qfull_batch(const uint8_t *w, const RowLayout &L, const uint32_t (&rix)[NR],
                                            int base, const KSlot &ks, const int4 *staged, const float *dxs,
                                            const int2 *sums, float (&acc)[NR]) {
    UnitRaw raw[NR][U];
    const UnitAddr a = unit_addr<F>(w, L, (uint32_t)base);
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        const size_t ro = qrow_offset(rix[r], L.bytes);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            load_quants_at<F, STEP>(a, ro, u, raw[r][u]);
            load_rest_at<F, STEP>(a, ro, u, raw[r][u]);
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const UnitInput in = qinput(staged, dxs, sums, base + STEP * u);
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] += dot_unit<F>(raw[r][u], ks, in);
    }
}

// ROUTED, not GATED: acc[r] += the dots of a full batch of units of the input's segments, each
// from its own expert: unit v lies in segment j = v / segu, at unit v - j segu of its row, and the
// segment's expert's matrix begins seg_ro[j] bytes into w (rows of L.bytes, rix[r] the row).
template <int F, int NR, int U, int STEP>
__device__ __forceinline__ void qrouted_batch(const uint8_t *w, const RowLayout &L, const uint32_t (&rix)[NR],
                                              int base, const KSlot &ks, const int4 *staged, const float *dxs,
                                              const int2 *sums, int segu, const long long *seg_ro, float (&acc)[NR]) {
    UnitRaw raw[NR][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int v = base + STEP * u, j = v / segu;
        const UnitAddr a = unit_addr<F>(w, L, (uint32_t)(v - j * segu));
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            const size_t ro = (size_t)seg_ro[j] + qrow_offset(rix[r], L.bytes);
            load_quants_at<F, STEP>(a, ro, 0, raw[r][u]);
            load_rest_at<F, STEP>(a, ro, 0, raw[r][u]);
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const UnitInput in = qinput(staged, dxs, sums, base + STEP * u);
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] += dot_unit<F>(raw[r][u], ks, in);
    }
}

// y[rows] = W[rows, cols] @ n(x) (+ bias) (+ y when accumulate), W in format F; GATED, AM, R,
// KS and ROUTED as in gemv_kernel (ROUTED, not GATED: rt.seg % 32 == 0, % 256 for _K and IQ4_XS; W's rows
// are rt.seg weights); HAND: the instance that takes part in the handoff (`hand`; the others
// compile without it). Dynamic shared memory: units * QGEMV_STAGE_BYTES.
// Limits: cols % 32 == 0 (% 256 for _K and IQ4_XS), cols <= GEMV_MAX_COLS, W, x and norm_w 16-byte aligned.
template <int F, int R, int KS, bool GATED, bool AM, bool ROUTED, bool HAND>
__global__ void __launch_bounds__(GEMV_THREADS, GEMV_MIN_BLOCKS)
qgemv_kernel(const uint8_t *__restrict__ w, const float *__restrict__ x, int rows, int cols,
             const uint16_t *__restrict__ bias, const uint16_t *__restrict__ norm_w, float eps, float norm_add,
             int accumulate, float *__restrict__ y, GemvArgmax am, GemvRoute rt, QuantHandoff hand) {
    constexpr int NR = GATED ? 2 * R : R;
    constexpr int U = qgemv_batch(NR);
    constexpr int GROUPS = GEMV_WARPS / KS;
    constexpr int STEP = 32 * KS;
    static_assert(!(AM && GATED), "the argmax is the lm_head's");
    static_assert(!(AM && ROUTED), "a routed product takes no argmax");
    extern __shared__ int4 staged[];  // [2 * units] int8 words, then (s0, s1)[units], then dx[units]
    __shared__ float red[GEMV_WARPS];
    __shared__ int route_ids[MOE_MAX_USED];  // ROUTED: the block's copy of the route
    __shared__ float route_scale[MOE_MAX_USED];
    __shared__ long long seg_ro[MOE_MAX_USED];
    const int units = cols / QUNIT;
    const RowLayout L = row_layout(F, ROUTED && !GATED ? rt.seg : cols);
    int2 *sums = reinterpret_cast<int2 *>(staged + 2 * units);  // 8-byte aligned for any units
    float *dxs = reinterpret_cast<float *>(sums + units);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int group = warp / KS, first = (warp % KS) * 32 + lane;
    const int block_tasks = ((rows + R - 1) / R + GROUPS - 1) / GROUPS;

    pdl_launch_dependents();
    // Before the wait: the quants of the first batch of the block's first task (weights no kernel
    // writes), so that their DRAM latency overlaps the kernel before and the staging below. (The
    // scales follow after the staging: holding them too through it costs spills.)
    // Units past the end (only where units < STEP * U) load the last unit instead: the loads need
    // no branches, and the dots below skip them.
    UnitRaw first_batch[NR][U];
    if (!ROUTED && blockIdx.x < block_tasks) {
        uint32_t rix[NR];
        qtask_rows<R, GATED>(blockIdx.x * GROUPS + group, rows, rix);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const UnitAddr a = unit_addr<F>(w, L, (uint32_t)min(first + STEP * u, units - 1));
#pragma unroll
            for (int r = 0; r < NR; ++r) load_quants_at<F, STEP>(a, qrow_offset(rix[r], L.bytes), 0, first_batch[r][u]);
        }
    }
    pdl_wait();
    const int segu = rt.seg / QUNIT;  // ROUTED, not GATED: a segment's units
    if constexpr (ROUTED) {  // seen by every thread after the staging's barrier
        stage_route(rt, route_ids, route_scale);
        if (!GATED && tid < rt.count) seg_ro[tid] = (long long)(rt.ids ? rt.ids[tid] : 0) * rows * L.bytes;
    }

    stage_input(x, cols, norm_w, eps, norm_add, HAND ? hand.in : nullptr, staged, dxs, sums, red);
    __syncthreads();

    // The scale and min of a _K unit depend on its place j = u % 8 in the superblock, the same for
    // all of a lane's units (first + STEP * k, STEP a multiple of 32).
    const KSlot ks = k_slot(first % 8);
    ArgmaxSeen seen;  // AM: what this lane saw of the rows it wrote
    // The loop bound is uniform over the block: every warp reaches the barriers of the epilogue.
    for (int bt = blockIdx.x; bt < block_tasks; bt += gridDim.x) {
        const int task = bt * GROUPS + group;
        uint32_t rix[NR];
        qtask_rows<R, GATED>(task, rows, rix);
        if constexpr (ROUTED && GATED) {  // the chosen experts' gate rows, their up rows rt.up further
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int j = (int)rix[r] / rt.seg;
                rix[r] = (uint32_t)(route_ids[j] * rt.seg) + (rix[r] - (uint32_t)(j * rt.seg));
                rix[R + r] = (uint32_t)rt.up + rix[r];
            }
        }
        float acc[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
        int base = first;
        if (!ROUTED && bt == blockIdx.x) {  // the batch whose quants were loaded before the wait
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const UnitAddr a = unit_addr<F>(w, L, (uint32_t)min(base + STEP * u, units - 1));
#pragma unroll
                for (int r = 0; r < NR; ++r) load_rest_at<F, STEP>(a, qrow_offset(rix[r], L.bytes), 0, first_batch[r][u]);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (base + STEP * u < units) {
                    const UnitInput in = qinput(staged, dxs, sums, base + STEP * u);
#pragma unroll
                    for (int r = 0; r < NR; ++r) acc[r] += dot_unit<F>(first_batch[r][u], ks, in);
                }
            }
            base += STEP * U;
        }
        // Full batches, then the units left (fewer than a batch), one at a time.
        if constexpr (ROUTED && !GATED) {
            for (; base + STEP * (U - 1) < units; base += STEP * U)
                qrouted_batch<F, NR, U, STEP>(w, L, rix, base, ks, staged, dxs, sums, segu, seg_ro, acc);
            if constexpr (U > 1) {
                for (; base < units; base += STEP)
                    qrouted_batch<F, NR, 1, STEP>(w, L, rix, base, ks, staged, dxs, sums, segu, seg_ro, acc);
            }
        } else {
            for (; base + STEP * (U - 1) < units; base += STEP * U)
                qfull_batch<F, NR, U, STEP>(w, L, rix, base, ks, staged, dxs, sums, acc);
            if constexpr (U > 1) {
                for (; base < units; base += STEP)
                    qfull_batch<F, NR, 1, STEP>(w, L, rix, base, ks, staged, dxs, sums, acc);
            }
        }
        gemv_finish_task<R, KS, GATED, AM>(acc, task, rows, bias, accumulate, y, seen,
                                           ROUTED && (GATED || bias) ? route_scale : nullptr, rt.seg,
                                           ROUTED ? route_ids : nullptr, rt.count, rt.up);
    }
    if constexpr (GATED && !ROUTED && HAND) {
        if (hand.out != nullptr && warp % KS == 0) quant_handoff<R, GROUPS>(y, rows, block_tasks, group, hand, lane);
    }
    if constexpr (AM) argmax_finish<GEMV_WARPS>(seen, am);
}

// What one quantized GEMV launch computes.
struct QgemvArgs {
    int format;
    const uint8_t *w;
    const float *x;
    int rows, cols;
    const uint16_t *bias, *norm_w;
    float eps;
    int accumulate;
    float *y;
    const GemvArgmax *am;
    float norm_add = 0.0f;  // what the norm adds to its weights (norm_plus_one: 1)
    const GemvRoute *route = nullptr;  // a mixture of experts' product (moe.cu)
    bool hand_out = false, hand_in = false;  // the SwiGLU GEMV's output to the handoff; the input from it
};

// Launches the instance (F, R, KS, GATED, AM, ROUTED, HAND) sized as the bf16 GEMV is: enough
// blocks for every SM at its occupancy limit, no more than there is work.
template <int F, int R, int KS, bool GATED, bool AM, bool ROUTED = false, bool HAND = false>
static int launch_qgemv_kernel(arc_context *ctx, const QgemvArgs &a) {
    auto kernel = qgemv_kernel<F, R, KS, GATED, AM, ROUTED, HAND>;
    const size_t smem = (size_t)(a.cols / QUNIT) * QGEMV_STAGE_BYTES;
    int blocks = 0;
    ARC_TRY(gemv_blocks(ctx, kernel, smem, a.rows, R, KS, &blocks));
    const char *name = ROUTED ? "qgemv_kernel<routed>" : GATED ? "qgemv_kernel<swiglu>"
                                                      : AM ? "qgemv_kernel<argmax>" : "qgemv_kernel";
    return arc_launch_pdl(ctx, name, kernel, dim3(blocks), dim3(GEMV_THREADS), smem, a.w, a.x, a.rows, a.cols,
                          a.bias, a.norm_w, a.eps, a.norm_add, a.accumulate, a.y, a.am ? *a.am : GemvArgmax{},
                          a.route ? *a.route : GemvRoute{},
                          QuantHandoff{a.hand_out ? ctx->handoff : nullptr, ctx->handoff_done,
                                       a.hand_in ? ctx->handoff : nullptr});
}

template <int F, int R, int KS, bool GATED>
static int launch_qgemv_shape(arc_context *ctx, const QgemvArgs &a) {
    if constexpr (!GATED) {
        if (a.am) return launch_qgemv_kernel<F, R, KS, GATED, true>(ctx, a);
    }
    if (a.hand_in || a.hand_out) return launch_qgemv_kernel<F, R, KS, GATED, false, false, true>(ctx, a);
    return launch_qgemv_kernel<F, R, KS, GATED, false>(ctx, a);
}

// The plan of a one-row quantized product of a shape: R rows a task and KS warps splitting k, as
// the bf16 GEMV splits over the row's 16-byte quant vectors (GATED takes at most R = 2; a split of
// 8 runs as 4: both are 4 warps a task). The decode's launch below and the verify's rows kernels
// (qgemv_rows.cuh) both take it from here, so a row's sums are added in one order whichever runs.
static inline GemvPlan qgemv_plan(const arc_context *ctx, int format, int32_t rows, int32_t cols, bool gated) {
    int ks = 1;
    const int r = gemv_split(ctx, rows, cols / QUNIT * (format == ARC_FORMAT_Q8_0 ? 2 : 1), gated ? 2 : 4, gated, &ks);
    return GemvPlan{r, r == 1 ? (ks >= 4 ? 4 : ks) : 1, false};
}

// Launches format F's instance of the shape's plan; a routed product (a mixture's expert) takes
// rows of 1 or 2 a task and no split over k.
template <int F, bool GATED>
static int launch_qgemv_format(arc_context *ctx, const QgemvArgs &a) {
    if (a.route) {
        int ks = 1;
        const int r = gemv_split(ctx, a.rows, a.cols / QUNIT * (F == ARC_FORMAT_Q8_0 ? 2 : 1), 2, GATED, &ks);
        return r == 2 ? launch_qgemv_kernel<F, 2, 1, GATED, false, true>(ctx, a)
                      : launch_qgemv_kernel<F, 1, 1, GATED, false, true>(ctx, a);
    }
    const GemvPlan plan = qgemv_plan(ctx, F, a.rows, a.cols, GATED);
    if constexpr (!GATED) {
        if (plan.r == 4) return launch_qgemv_shape<F, 4, 1, GATED>(ctx, a);
    }
    if (plan.r == 2) return launch_qgemv_shape<F, 2, 1, GATED>(ctx, a);
    switch (plan.ks) {
    case 4: return launch_qgemv_shape<F, 1, 4, GATED>(ctx, a);
    case 2: return launch_qgemv_shape<F, 1, 2, GATED>(ctx, a);
    default: return launch_qgemv_shape<F, 1, 1, GATED>(ctx, a);
    }
}

// The instances of a few formats each, compiled in their own files (qgemv_*.cu).
int launch_qgemv_q8_q4(arc_context *ctx, const QgemvArgs &a, bool gated);
int launch_qgemv_k(arc_context *ctx, const QgemvArgs &a, bool gated);
int launch_qgemv_codebook(arc_context *ctx, const QgemvArgs &a, bool gated);
int launch_qgemv_q5(arc_context *ctx, const QgemvArgs &a, bool gated);
int launch_qgemv_two_bit(arc_context *ctx, const QgemvArgs &a, bool gated);
