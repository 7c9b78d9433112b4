// gemv_rows.cu -- the bf16 GEMV over up to ROWS_MAX input rows at once: the speculative verify's
// products. Each weight is read once for every row, and each row's output has the bits the
// one-row GEMV (gemv.cu) gives for that row alone, by construction:
//   - a row's dot product is summed in the one-row launch's order: lane `first` of a row task
//     adds its vectors first, first + 32 KS, ... in turn, each with dot8's 8 fused multiply-adds
//     in element order; the warp sums its lanes (warp_sum), and the KS warps of a task add their
//     sums in warp order (gemv_finish_task). The rows per task R, the batching of the loads and
//     the interleaving of different sums change no sum; KS is taken from the one-row plan of the
//     same shape (gemv_common.cuh: gemv_plan), and R too, as it spreads the tasks;
//   - a fused norm (norm_staged, or norm_rows_kernel first where the rows are staged in chunks)
//     sums the squares in the order that plan's launch does (in the warp where the input stays in
//     registers, WX; else thread t of 256 adds vectors t + 256 j, then block_sum's order), and
//     scales each element as norm8 does;
//   - the epilogue (bias, residual add, GLU) is gemv_finish_task's, row by row.
// The rows are staged in shared memory as float32, all of them when they fit (ROWS_ONE_BYTES),
// else in chunks of vectors, double-buffered with cp.async; a chunk is a whole number of every
// lane's batches, so every lane still meets its vectors in order.
#include "gemv_common.cuh"
#include "model/tensor_core.cuh"

// ROWS_THREADS: 16 warps a block, one block an SM (all its registers), sharing one staged input.
enum { ROWS_MAX = 8, ROWS_THREADS = 512, ROWS_WARPS = ROWS_THREADS / 32, ROWS_ONE_BYTES = 200 * 1024,
       ROWS_BUF_BYTES = 96 * 1024 };

// xn[r] = x[r] * rsqrtf(mean(x[r]^2) + eps) * (add + w), one block a row r of cols floats; the
// squares summed as the one-row GEMV of the product sums them (wx: its warp-local order).
__global__ void __launch_bounds__(GEMV_THREADS)
norm_rows_kernel(const float *__restrict__ x, int cols, const uint16_t *__restrict__ norm_w, float eps, float add,
                 int wx, float *__restrict__ xn) {
    __shared__ float red[GEMV_WARPS];
    pdl_launch_dependents();
    pdl_wait();
    const int nvec = cols / 8, tid = threadIdx.x;
    const float4 *x4 = reinterpret_cast<const float4 *>(x + (size_t)blockIdx.x * cols);
    float4 *o4 = reinterpret_cast<float4 *>(xn + (size_t)blockIdx.x * cols);
    const uint4 *nw = reinterpret_cast<const uint4 *>(norm_w);
    float ss = 0.0f, inv;
    if (wx) {  // every warp sums the whole row, lane l its vectors l + 32 j
        for (int v = tid % 32; v < nvec; v += 32) ss = add_sq8(ss, x4[2 * v], x4[2 * v + 1]);
        inv = rsqrtf(warp_sum(ss) / (float)cols + eps);
    } else {
        for (int v = tid; v < nvec; v += GEMV_THREADS) ss = add_sq8(ss, x4[2 * v], x4[2 * v + 1]);
        inv = rsqrtf(block_sum(ss, red) / (float)cols + eps);
    }
    for (int v = tid; v < nvec; v += GEMV_THREADS) {
        float4 a = x4[2 * v], b = x4[2 * v + 1];
        norm8(a, b, inv, nw[v], add);
        o4[2 * v] = a;
        o4[2 * v + 1] = b;
    }
}

// The 8 bf16 weights of w as floats, element 0 the low half of w.x (dot8's order).
__device__ __forceinline__ void bf16x8(uint4 w, float (&f)[8]) {
    f[0] = bf16_lo(w.x); f[1] = bf16_hi(w.x); f[2] = bf16_lo(w.y); f[3] = bf16_hi(w.y);
    f[4] = bf16_lo(w.z); f[5] = bf16_hi(w.z); f[6] = bf16_lo(w.w); f[7] = bf16_hi(w.w);
}

// Chunk c0.. (up to cv vectors) of each of the m rows of x into buf: row i's low halves at
// i * 2 cv + v, its high halves cv further; one cp.async group.
__device__ __forceinline__ void stage_rows(const float *x, int m, int cols, int nvec, int c0, int cv, float4 *buf) {
    const int n = min(cv, nvec - c0);
    for (int i = threadIdx.x; i < m * 2 * n; i += ROWS_THREADS) {
        const int row = i / (2 * n), rem = i - row * 2 * n, v = rem >> 1, h = rem & 1;
        cp_async16(smem_addr(buf + row * 2 * cv + h * cv + v), x + (size_t)row * cols + (size_t)(c0 + v) * 8 + h * 4,
                   true);
    }
    cp_async_commit();
}

// The vectors of each weight row a lane loads in a batch: 4 weight vectors in all, 1 a row where
// a task splits k (KS >= 4: so that a chunk of 8 rows, a whole number of batches, fits twice).
constexpr int rows_batch(int nr, int ks) { return nr >= 4 || ks >= 4 ? 1 : 4 / nr; }

// The fused norm of the m rows staged whole in xs (cv vectors a row half): each row's squares
// summed in the one-row GEMV's order (norm_rows_kernel's), then the row scaled in place.
__device__ __forceinline__ void norm_staged(float4 *xs, int m, int cols, int cv, const uint16_t *norm_w, float eps,
                                            float add, bool wx) {
    __shared__ float red[ROWS_WARPS], inv[ROWS_MAX];
    const int nvec = cols / 8, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    if (wx) {  // warp i sums row i, lane l its vectors l + 32 j
        if (warp < m) {
            const float4 *r = xs + warp * 2 * cv;
            float ss = 0.0f;
            for (int v = lane; v < nvec; v += 32) ss = add_sq8(ss, r[v], r[cv + v]);
            ss = warp_sum(ss);
            if (lane == 0) inv[warp] = rsqrtf(ss / (float)cols + eps);
        }
    } else {  // two rows at a time, each over 256 threads as the one-row GEMV's block sums it
        for (int i0 = 0; i0 < m; i0 += 2) {
            const int half = tid / GEMV_THREADS, i = i0 + half, t = tid % GEMV_THREADS;
            float ss = 0.0f;
            if (i < m) {
                const float4 *r = xs + i * 2 * cv;
                for (int v = t; v < nvec; v += GEMV_THREADS) ss = add_sq8(ss, r[v], r[cv + v]);
            }
            ss = warp_sum(ss);
            if (lane == 0) red[warp] = ss;
            __syncthreads();
            if (t == 0 && i < m) {
                float sum = 0.0f;
                for (int w = 0; w < GEMV_WARPS; ++w) sum += red[half * GEMV_WARPS + w];
                inv[i] = rsqrtf(sum / (float)cols + eps);
            }
            __syncthreads();
        }
    }
    __syncthreads();
    const uint4 *nw = reinterpret_cast<const uint4 *>(norm_w);
    for (int idx = tid; idx < m * nvec; idx += ROWS_THREADS) {
        const int i = idx / nvec, v = idx - i * nvec;
        float4 *r = xs + i * 2 * cv;
        float4 a = r[v], b = r[cv + v];
        norm8(a, b, inv[i], nw[v], add);
        r[v] = a;
        r[cv + v] = b;
    }
    __syncthreads();
}

// y[i] (rows, ldy apart) = W @ n(x[i]) (+ bias) (+ y[i] when accumulate) for the m rows x[i] of cols floats;
// GATED: W = [gate; up] (2 rows, cols), y[i][r] = act(gate_r . n(x[i])) * (up_r . n(x[i])), act in
// the accumulate slot. n: with norm_w null none, else the fused norm (norm_staged; one chunk only).
// Row tasks of R rows, KS warps a task (the one-row plan's), blocks striding over groups of tasks;
// cv: vectors a chunk (whole batches of every lane; nvec or more: one chunk, staged once). Dynamic shared
// memory: m * cv * 32 bytes, twice when chunked.
template <int R, int KS, bool GATED>
__global__ void __launch_bounds__(ROWS_THREADS, 1)
gemv_rows_kernel(const uint16_t *__restrict__ w, const float *__restrict__ x, int m, int rows, int cols,
                 const uint16_t *__restrict__ bias, int accumulate, float *__restrict__ y, int ldy, int cv,
                 const uint16_t *__restrict__ norm_w, float eps, float norm_add, int wx) {
    constexpr int NR = GATED ? 2 * R : R, U = rows_batch(NR, KS);
    constexpr int GROUPS = ROWS_WARPS / KS, STEP = 32 * KS;
    extern __shared__ float4 xs[];
    const int nvec = cols / 8, tid = threadIdx.x, warp = tid / 32;
    const int group = warp / KS, first = (warp % KS) * 32 + tid % 32;
    const int tasks = (rows + R - 1) / R, block_tasks = (tasks + GROUPS - 1) / GROUPS;
    const int chunks = (nvec + cv - 1) / cv, buf_vecs = m * 2 * cv;
    // Solo warps (one warp a task, the input staged once): each warp takes tasks of its own,
    // dealt round the blocks (so every SM gets its share), with no barrier between them. Else the
    // block's warps step through groups of tasks and the chunks together.
    const bool solo = KS == 1 && chunks == 1;
    const int wg = warp * gridDim.x + blockIdx.x, all = gridDim.x * ROWS_WARPS;
    const int mine = solo ? (wg < tasks ? (tasks - 1 - wg) / all + 1 : 0)
                          : (blockIdx.x < block_tasks ? (block_tasks - 1 - blockIdx.x) / gridDim.x + 1 : 0);
    const uint4 *wv = reinterpret_cast<const uint4 *>(w);
    pdl_launch_dependents();
    if (solo ? (int)blockIdx.x >= tasks : mine == 0) return;  // the whole block: no barrier is left waiting
    // Before the wait: the first weights of the warp's first task (no kernel writes weights).
    const uint4 *wr[NR];
    task_rows<R, GATED>(wv, solo ? wg : blockIdx.x * GROUPS + group, rows, nvec, wr);
    uint4 wt[NR][U];
    load_batch<NR, U>(wr, first, STEP, nvec, wt);
    pdl_wait();
    stage_rows(x, m, cols, nvec, 0, cv, xs);
    if (norm_w != nullptr) {
        cp_async_wait<0>();
        __syncthreads();
        norm_staged(xs, m, cols, cv, norm_w, eps, norm_add, wx != 0);
    } else if (solo) {
        cp_async_wait<0>();
        __syncthreads();
    }
    float acc[ROWS_MAX][NR];
    ArgmaxSeen seen;  // gemv_finish_task's argument; no argmax here
    // The lane's weights stream on without a gap: each batch loads the next one, in this chunk, in
    // the next (cv is a whole number of batches), or the first of the warp's next task.
    const int task_step = solo ? all : gridDim.x * GROUPS;
    int task = solo ? wg : blockIdx.x * GROUPS + group;
    for (int it = 0; it < mine * chunks; ++it) {
        const int c = it % chunks, c0 = c * cv, c1 = min(nvec, c0 + cv);
        const bool last = c == chunks - 1, next_task = last && it + 1 < mine * chunks;
        const float4 *buf = xs + (chunks > 1 ? (it & 1) * buf_vecs : 0);
        if (c == 0) {
#pragma unroll
            for (int i = 0; i < ROWS_MAX; ++i)
#pragma unroll
                for (int r = 0; r < NR; ++r) acc[i][r] = 0.0f;
        }
        if (chunks > 1 && it + 1 < mine * chunks) {
            stage_rows(x, m, cols, nvec, ((it + 1) % chunks) * cv, cv, xs + ((it + 1) & 1) * buf_vecs);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        if (!solo) __syncthreads();  // the chunk is staged
        bool fetched = false;  // the next task's first batch
        for (int v0 = c0 + first; v0 < c1; v0 += STEP * U) {
            uint4 wn[NR][U];  // the lane's next batch, loaded before this one is used
            if (next_task && v0 + STEP * U >= c1) {
                task_rows<R, GATED>(wv, task + task_step, rows, nvec, wr);
                load_batch<NR, U>(wr, first, STEP, nvec, wn);
                fetched = true;
            } else {
                load_batch<NR, U>(wr, v0 + STEP * U, STEP, nvec, wn);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int lv = v0 + STEP * u - c0;
                if (c0 + lv >= c1) break;
                float wf[NR][8];  // the vector's weights as floats, once for every row
#pragma unroll
                for (int r = 0; r < NR; ++r) bf16x8(wt[r][u], wf[r]);
#pragma unroll
                for (int i = 0; i < ROWS_MAX; i += 2) {  // two rows at a time: independent sums a step
                    if (i < m) {
                        float xf[2][8];
#pragma unroll
                        for (int j = 0; j < 2; ++j) {
                            const int row = i + j < m ? i + j : i;  // an odd m repeats its last row, unused
                            const float4 a = buf[row * 2 * cv + lv], b = buf[row * 2 * cv + cv + lv];
                            xf[j][0] = a.x; xf[j][1] = a.y; xf[j][2] = a.z; xf[j][3] = a.w;
                            xf[j][4] = b.x; xf[j][5] = b.y; xf[j][6] = b.z; xf[j][7] = b.w;
                        }
                        // Element e of every sum before element e + 1: each sum still adds its 8
                        // products in dot8's order, but no product waits on the one before it.
#pragma unroll
                        for (int e = 0; e < 8; ++e)
#pragma unroll
                            for (int j = 0; j < 2; ++j)
#pragma unroll
                                for (int r = 0; r < NR; ++r) acc[i + j][r] = fmaf(wf[r][e], xf[j][e], acc[i + j][r]);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < NR; ++r)
#pragma unroll
                for (int u = 0; u < U; ++u) wt[r][u] = wn[r][u];
        }
        if (last) {
#pragma unroll
            for (int i = 0; i < ROWS_MAX; ++i)
                if (i < m)
                    gemv_finish_task<R, KS, GATED, false, NR, ROWS_WARPS>(acc[i], task, rows, bias, accumulate,
                                                                          y + (size_t)i * ldy, seen);
            task += task_step;
            if (next_task && !fetched) {  // a lane with no vector in the last chunk
                task_rows<R, GATED>(wv, task, rows, nvec, wr);
                load_batch<NR, U>(wr, first, STEP, nvec, wt);
            }
        }
        if (!solo) __syncthreads();  // every warp is done with the buffer before it is staged again
    }
}

// The launch of the rows kernel for one plan; the norm fused where the rows are staged whole,
// else run first by norm_rows_kernel into io.scratch. GATED: the kernel's accumulate slot carries
// the activation, io.act.
template <int R, int KS, bool GATED>
static int launch_rows(arc_context *ctx, const uint16_t *w, const GemvIo &io, bool wx) {
    const float *x = io.x;
    const uint16_t *norm_w = io.norm_weight;
    const int m = io.m, rows = io.rows, cols = io.cols;
    auto kernel = gemv_rows_kernel<R, KS, GATED>;
    constexpr int BATCH = 32 * KS * rows_batch(GATED ? 2 * R : R, KS);  // a chunk is a whole number of these
    const int nvec = cols / 8;
    int cv = (nvec + BATCH - 1) / BATCH * BATCH;
    size_t smem = (size_t)m * cv * 32;
    if (smem > ROWS_ONE_BYTES) {  // chunks, two buffers
        cv = ROWS_BUF_BYTES / (m * 32) / BATCH * BATCH;
        if (cv < BATCH) cv = BATCH;
        smem = 2 * (size_t)m * cv * 32;
        if (norm_w != nullptr) {
            ARC_TRY(arc_launch_pdl(ctx, "norm_rows_kernel", norm_rows_kernel, dim3(m), dim3(GEMV_THREADS), 0, x, cols,
                                   norm_w, io.eps, io.norm_add, wx ? 1 : 0, io.scratch));
            x = io.scratch;
            norm_w = nullptr;
        }
    }
    int blocks = 0;
    if (KS == 1 && cv >= nvec)  // solo warps (the kernel's): as many blocks as tasks, up to the GPU's fill
        ARC_TRY(gemv_blocks(ctx, kernel, smem, (rows + R - 1) / R, 1, ROWS_WARPS, &blocks, ROWS_THREADS));
    else
        ARC_TRY(gemv_blocks(ctx, kernel, smem, rows, R, KS, &blocks, ROWS_THREADS));
    return arc_launch_pdl(ctx, GATED ? "gemv_rows_kernel<swiglu>" : "gemv_rows_kernel", kernel, dim3(blocks),
                          dim3(ROWS_THREADS), smem, w, x, m, rows, cols, io.bias, GATED ? io.act : io.accumulate,
                          io.y, io.ldy, cv, norm_w, io.eps, io.norm_add, wx ? 1 : 0);
}

// The instance of the one-row plan's R and KS.
template <bool GATED, typename... Args>
static int launch_plan(const GemvPlan &plan, Args... args) {
    if constexpr (!GATED) {
        if (plan.r == 4) return launch_rows<4, 1, GATED>(args...);
    }
    if (plan.r == 2) return launch_rows<2, 1, GATED>(args...);
    switch (plan.ks) {
    case 8: return launch_rows<1, 8, GATED>(args...);
    case 4: return launch_rows<1, 4, GATED>(args...);
    case 2: return launch_rows<1, 2, GATED>(args...);
    default: return launch_rows<1, 1, GATED>(args...);
    }
}

int gemv_rows(arc_context *ctx, const char *who, const uint16_t *w, const GemvIo &io, bool gated) {
    ARC_REQUIRE_AS(who, ctx, "ctx is null");
    ARC_TRY(check_gemv_io(who, w, io.x, io.rows, io.cols, io.norm_weight, io.eps, io.y));
    ARC_REQUIRE_AS(who, io.cols > 0 && io.cols % 8 == 0, "cols must be a positive multiple of 8, got %d", io.cols);
    ARC_REQUIRE_AS(who, io.m >= 1 && io.m <= ROWS_MAX, "m must be in 1..%d, got %d", ROWS_MAX, io.m);
    ARC_REQUIRE_AS(who, io.ldy >= io.rows, "the output rows' stride %d is below rows %d", io.ldy, io.rows);
    ARC_REQUIRE_AS(who, !gated || io.rows <= INT32_MAX / 2, "rows %d too large", io.rows);
    ARC_REQUIRE_AS(who,
                   io.norm_weight == nullptr || (io.scratch && (uintptr_t)io.scratch % 16 == 0 && io.scratch != io.y),
                   "a fused norm needs xn: 16-byte aligned, m x cols floats, not y");
    if (gated)
        ARC_REQUIRE_AS(who, io.act >= ARC_ACT_SILU && io.act <= ARC_ACT_SWIGLU_LIMIT, "unknown activation %d", io.act);
    const GemvPlan plan = gemv_plan(ctx, io.rows, io.cols, gated);
    if (gated) return launch_plan<true>(plan, ctx, w, io, plan.wx);
    return launch_plan<false>(plan, ctx, w, io, plan.wx);
}

extern "C" int arc_op_gemv_rows(arc_context *ctx, const uint16_t *w, const float *x, int32_t m, int32_t rows,
                                int32_t cols, const uint16_t *bias, const uint16_t *norm_weight, float eps,
                                int32_t accumulate, float *xn, float *y) {
    ARC_REQUIRE(accumulate == 0 || accumulate == 1, "accumulate must be 0 or 1, got %d", accumulate);
    return gemv_rows(ctx, __func__, w,
                     {.x = x, .m = m, .rows = rows, .cols = cols, .bias = bias, .norm_weight = norm_weight, .eps = eps,
                      .accumulate = accumulate, .scratch = xn, .y = y, .ldy = rows},
                     /*gated=*/false);
}

extern "C" int arc_op_gemv_rows_swiglu(arc_context *ctx, const uint16_t *w_gate_up, const float *x, int32_t m,
                                       int32_t rows, int32_t cols, const uint16_t *norm_weight, float eps, float *xn,
                                       float *y) {
    return gemv_rows(ctx, __func__, w_gate_up,
                     {.x = x, .m = m, .rows = rows, .cols = cols, .norm_weight = norm_weight, .eps = eps,
                      .act = ARC_ACT_SILU, .scratch = xn, .y = y, .ldy = rows},
                     /*gated=*/true);
}
