// qgemv_rows.cuh -- the quantized GEMV over up to QROWS_MAX input rows at once: the speculative
// verify's products over GGUF's block formats. Each weight unit is loaded once and meets every
// row, and each row's output has the bits the one-row GEMV (qgemv.cuh) gives for that row alone,
// by construction:
//   - each row's input is quantized by the one-row staging itself (qinput.cuh: stage_input, run by
//     qstage_rows_kernel a row a block), with its fused norm; the handoff that feeds the decode's
//     down GEMV quantizes with the same arithmetic, so its bits are these too;
//   - a unit's dot is dot_w's (dot_unit's: quant.cuh), and lane `first` of a row task adds its
//     units first, first + 32 KS, ... in turn, as the one-row lane does; the warp and the KS warps
//     of a task add their sums as gemv_finish_task does. KS is the one-row plan's (qgemv.cuh: qgemv_plan);
//     the rows a task and the batching of the loads change no sum.
// Each weight unit is decoded once for the m rows (quant.cuh: unit_weights), and its dot with a
// row is dot_w, whose float operations are each rounded on their own, so that no fused
// multiply-add can differ between this kernel and the one-row GEMV that inlines the same code.
// The staged rows (QGEMV_STAGE_BYTES a unit) are copied into shared memory whole, each row's
// int8 words split into the units' first and second halves so that a warp's reads of consecutive
// units meet no bank twice; rows that do not fit together (very wide inputs) take more launches.
// Instances live in qgemv_rows_*.cu, a few formats a file.
#pragma once

#include "qgemv.cuh"

// QROWS_THREADS: 16 warps a block, one block an SM (all its registers), sharing the staged rows.
enum { QROWS_MAX = 8, QROWS_THREADS = 512, QROWS_WARPS = QROWS_THREADS / 32, QROWS_SMEM = 200 * 1024 };

// A staged row's bytes, in the staging's layout (the words, the half sums, dx) padded to 16.
__host__ __device__ constexpr size_t qrow_stride(int units) {
    return ((size_t)units * QGEMV_STAGE_BYTES + 15) / 16 * 16;
}

// The m staged rows (each qrow_stride apart in xq) into shared memory: row i at i * stride, its
// units' first halves (int4) then their second halves, then the sums and dx as staged. All loads
// of a pass in flight before any store. Every thread calls this; a barrier must follow.
__device__ __forceinline__ void copy_staged_rows(const uint8_t *xq, int m, int units, size_t stride, uint8_t *sm) {
    const int halves = 2 * units, tail = 3 * units;  // int4 halves, then 4-byte words of sums and dx
    const int per_row = halves + tail, n = m * per_row;
    for (int i0 = threadIdx.x; i0 < n; i0 += QROWS_THREADS * 4) {
        int4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int i = i0 + k * QROWS_THREADS, row = i / per_row, j = i - row * per_row;
            if (i < n) {
                const uint8_t *src = xq + row * stride;
                if (j < halves) v[k] = __ldcg(reinterpret_cast<const int4 *>(src) + j);
                else v[k].x = __ldcg(reinterpret_cast<const int *>(src + 32 * (size_t)units) + (j - halves));
            }
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int i = i0 + k * QROWS_THREADS, row = i / per_row, j = i - row * per_row;
            if (i < n) {
                uint8_t *dst = sm + row * stride;
                if (j < halves) reinterpret_cast<int4 *>(dst)[(j & 1) * units + j / 2] = v[k];
                else reinterpret_cast<int *>(dst + 32 * (size_t)units)[j - halves] = v[k].x;
            }
        }
    }
}

// Unit v of staged row `row` (copy_staged_rows' layout).
__device__ __forceinline__ UnitInput qrow_input(const uint8_t *sm, size_t stride, int units, int row, int v) {
    const uint8_t *r = sm + row * stride;
    const int4 *h = reinterpret_cast<const int4 *>(r);
    UnitInput in;
    in.xa = h[v];
    in.xb = h[units + v];
    const int2 s = reinterpret_cast<const int2 *>(r + 32 * (size_t)units)[v];
    in.s0 = s.x;
    in.s1 = s.y;
    in.dx = reinterpret_cast<const float *>(r + 40 * (size_t)units)[v];
    return in;
}

// Units a lane loads a batch, over its NR rows: 2, so that two batches (the one in use and the
// next, streaming) fit the registers beside the 8 rows' sums.
constexpr int qrows_batch(int nr) { return nr >= 2 ? 1 : 2; }

// A batch: units base + STEP * u (past the end: the last unit) of the NR rows, every load issued.
template <int F, int NR, int U, int STEP>
__device__ __forceinline__ void qrows_load(const uint8_t *w, const RowLayout &L, const uint32_t (&rix)[NR], int base,
                                           int units, UnitRaw (&raw)[NR][U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const UnitAddr a = unit_addr<F>(w, L, (uint32_t)min(base + STEP * u, units - 1));
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            load_quants_at<F, STEP>(a, qrow_offset(rix[r], L.bytes), 0, raw[r][u]);
            load_rest_at<F, STEP>(a, qrow_offset(rix[r], L.bytes), 0, raw[r][u]);
        }
    }
}

// acc[i][r] += the dots of a batch of units (base + STEP * u, those < units) of NR weight rows
// with each of the m staged rows: unit by unit, so each row's sum meets its units in order.
template <int F, int NR, int U, int STEP>
__device__ __forceinline__ void qrows_dots(const UnitRaw (&raw)[NR][U], int base, int units, int m, const uint8_t *sm,
                                           size_t stride, const KSlot &ks, float (&acc)[QROWS_MAX][NR]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int v = base + STEP * u;
        if (v >= units) break;
        UnitW wts[NR];  // each weight row's unit decoded once, for every input row
#pragma unroll
        for (int r = 0; r < NR; ++r) wts[r] = unit_weights<F>(raw[r][u], ks);
#pragma unroll
        for (int i = 0; i < QROWS_MAX; ++i) {
            if (i < m) {
                const UnitInput in = qrow_input(sm, stride, units, i, v);
#pragma unroll
                for (int r = 0; r < NR; ++r) acc[i][r] += dot_w<F>(wts[r], in);
            }
        }
    }
}

// y[i] (rows, ldy apart) = W @ n(x[i]) (+ bias) (+ y[i] when accumulate) for the m rows staged in
// xq (qstage_rows_kernel, stride apart), W in format F; GATED: W = [gate; up], the activation in
// the accumulate slot. R rows a task (at most 2), KS warps a task (the one-row plan's). KS == 1:
// "solo" warps, each taking tasks of its own dealt round the blocks, with no barrier after the
// copy; else the block's warps step through groups of tasks together. Dynamic shared memory:
// m * stride.
template <int F, int R, int KS, bool GATED>
__global__ void __launch_bounds__(QROWS_THREADS, 1)
qgemv_rows_kernel(const uint8_t *__restrict__ w, const uint8_t *__restrict__ xq, int m, int rows, int cols,
                  const uint16_t *__restrict__ bias, int accumulate, float *__restrict__ y, int ldy) {
    constexpr int NR = GATED ? 2 * R : R;
    constexpr int U = qrows_batch(NR);
    constexpr int GROUPS = QROWS_WARPS / KS, STEP = 32 * KS;
    constexpr bool SOLO = KS == 1;
    extern __shared__ int4 qrows_smem[];
    const uint8_t *sm = reinterpret_cast<const uint8_t *>(qrows_smem);
    const int units = cols / QUNIT;
    const size_t stride = qrow_stride(units);
    const RowLayout L = row_layout(F, cols);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int group = warp / KS, first = (warp % KS) * 32 + lane;
    const int tasks = (rows + R - 1) / R, block_tasks = (tasks + GROUPS - 1) / GROUPS;
    const int wg = warp * gridDim.x + blockIdx.x, all = gridDim.x * QROWS_WARPS;
    const int mine = SOLO ? (wg < tasks ? (tasks - 1 - wg) / all + 1 : 0)
                          : (blockIdx.x < block_tasks ? (block_tasks - 1 - blockIdx.x) / gridDim.x + 1 : 0);
    const int task_step = SOLO ? all : gridDim.x * GROUPS;
    pdl_launch_dependents();
    // The lane's batches stream without a gap: each loads the next one before its dots (the next
    // of its task, or the first of the warp's next task), so a warp's loads are in flight while
    // it computes. The first, before the wait (weights no kernel writes). Units past the end load
    // the last unit; the dots skip them.
    int task = SOLO ? wg : blockIdx.x * GROUPS + group;
    uint32_t rix[NR];
    UnitRaw cur[NR][U];
    if (mine > 0) {
        qtask_rows<R, GATED>(task, rows, rix);
        qrows_load<F, NR, U, STEP>(w, L, rix, first, units, cur);
    }
    pdl_wait();
    copy_staged_rows(xq, m, units, stride, reinterpret_cast<uint8_t *>(qrows_smem));
    __syncthreads();
    const KSlot ks = k_slot(first % 8);  // the same place in the superblock for all of a lane's units
    ArgmaxSeen seen;                    // gemv_finish_task's argument; no argmax here
    for (int t = 0; t < mine; ++t, task += task_step) {
        float acc[QROWS_MAX][NR];
#pragma unroll
        for (int i = 0; i < QROWS_MAX; ++i)
#pragma unroll
            for (int r = 0; r < NR; ++r) acc[i][r] = 0.0f;
        for (int base = first; base < units; base += STEP * U) {
            UnitRaw nxt[NR][U];
            if (base + STEP * U < units) {
                qrows_load<F, NR, U, STEP>(w, L, rix, base + STEP * U, units, nxt);
            } else if (t + 1 < mine) {
                qtask_rows<R, GATED>(task + task_step, rows, rix);
                qrows_load<F, NR, U, STEP>(w, L, rix, first, units, nxt);
            }
            qrows_dots<F, NR, U, STEP>(cur, base, units, m, sm, stride, ks, acc);
#pragma unroll
            for (int r = 0; r < NR; ++r)
#pragma unroll
                for (int u = 0; u < U; ++u) cur[r][u] = nxt[r][u];
        }
#pragma unroll
        for (int i = 0; i < QROWS_MAX; ++i)
            if (i < m)
                gemv_finish_task<R, KS, GATED, false, NR, QROWS_WARPS>(acc[i], task, rows, bias, accumulate,
                                                                       y + (size_t)i * ldy, seen);
    }
}

// What one rows launch computes: m staged rows of xq, y rows ldy apart.
struct QrowsArgs {
    const uint8_t *w, *xq;
    int m, rows, cols;
    const uint16_t *bias;
    int accumulate;
    float *y;
    int ldy;
};

template <int F, int R, int KS, bool GATED>
static int launch_qrows_kernel(arc_context *ctx, const QrowsArgs &a) {
    auto kernel = qgemv_rows_kernel<F, R, KS, GATED>;
    const size_t smem = (size_t)a.m * qrow_stride(a.cols / QUNIT);
    int blocks = 0;
    if (KS == 1)  // solo warps: as many blocks as the tasks fill, up to the GPU's
        ARC_TRY(gemv_blocks(ctx, kernel, smem, (a.rows + R - 1) / R, 1, QROWS_WARPS, &blocks, QROWS_THREADS));
    else
        ARC_TRY(gemv_blocks(ctx, kernel, smem, a.rows, R, KS, &blocks, QROWS_THREADS));
    return arc_launch_pdl(ctx, GATED ? "qgemv_rows_kernel<swiglu>" : "qgemv_rows_kernel", kernel, dim3(blocks),
                          dim3(QROWS_THREADS), smem, a.w, a.xq, a.m, a.rows, a.cols, a.bias, a.accumulate, a.y, a.ldy);
}

// Format F's instance of the one-row plan's KS.
// R, which changes no sum, is at most 2 rows (1 gated): the streamed batches need the registers.
template <int F, bool GATED>
static int launch_qrows_format(arc_context *ctx, const GemvPlan &plan, const QrowsArgs &a) {
    if (plan.r > 1) return launch_qrows_kernel<F, GATED ? 1 : 2, 1, GATED>(ctx, a);
    switch (plan.ks) {
    case 4: return launch_qrows_kernel<F, 1, 4, GATED>(ctx, a);
    case 2: return launch_qrows_kernel<F, 1, 2, GATED>(ctx, a);
    default: return launch_qrows_kernel<F, 1, 1, GATED>(ctx, a);
    }
}

// The instances of a few formats each (qgemv_rows_*.cu).
int launch_qrows_q8_q4(arc_context *ctx, int format, bool gated, const GemvPlan &plan, const QrowsArgs &a);
int launch_qrows_k(arc_context *ctx, int format, bool gated, const GemvPlan &plan, const QrowsArgs &a);
int launch_qrows_codebook(arc_context *ctx, int format, bool gated, const GemvPlan &plan, const QrowsArgs &a);
int launch_qrows_q5(arc_context *ctx, int format, bool gated, const GemvPlan &plan, const QrowsArgs &a);
int launch_qrows_two_bit(arc_context *ctx, int format, bool gated, const GemvPlan &plan, const QrowsArgs &a);
