// gemv.cu -- the matrix-vector products of the forward, where nearly all of a token's time goes:
// every weight is read once per token, so the kernel is a stream of bf16 weights through the
// SMs, and its speed is the bandwidth it reaches.
//
// How it keeps the memory system busy: each thread has 8 independent 16-byte weight loads in
// flight (8 bf16 each; NR rows x U column steps, NR * U = 8), loaded with a no-L1-allocate hint
// since no weight is read twice. The input vector is staged once per block in shared memory
// (normalized on the way in when an RMSNorm is fused) and read from there; blocks loop over the
// rows (grid-stride), so staging is paid once per block, not once per row group. A short input
// (up to 1,024 columns) skips the staging: each warp holds it in registers (WX below), which
// takes the block barriers off the small models' chain of latencies. The lm_head may also take
// the argmax of what it writes (AM below), and in the device loop commit it: the greedy step's
// sampler without a kernel of its own.
#include "model/moe/moe.cuh"

// ROUTED and GATED: the gate and up rows of task `task`'s outputs under route rt (gemv_common.cuh),
// the experts read from the block's copy `ids`.
template <int R>
__device__ __forceinline__ void routed_task_rows(const uint4 *w, int task, int rows, int nvec, const GemvRoute &rt,
                                                 const int *ids, const uint4 *(&wr)[2 * R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = min(task * R + r, rows - 1), j = row / rt.seg;
        const size_t wrow = (size_t)ids[j] * rt.seg + (row - j * rt.seg);
        wr[r] = w + wrow * nvec;
        wr[R + r] = w + ((size_t)rt.up + wrow) * nvec;
    }
}

// ROUTED, not GATED: a batch of the rows' vectors v = base + step u of the input's segments, each
// from its own expert: wr[r] is row r of expert 0's matrix (segv vectors a row), and segment j of
// the input lies seg_off[j] vectors further (its expert's matrix, less the segment's start).
template <int NR, int U>
__device__ __forceinline__ void load_routed_batch(const uint4 *const (&wr)[NR], int base, int step, int nvec, int segv,
                                                  const long long *seg_off, uint4 (&wt)[NR][U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int v = base + step * u;
        const long long off = v < nvec ? seg_off[v / segv] + v : 0;
#pragma unroll
        for (int r = 0; r < NR; ++r) wt[r][u] = v < nvec ? load_nc128(wr[r] + off) : make_uint4(0, 0, 0, 0);
    }
}

// y[rows] = W[rows, cols] @ n(x) (+ bias) (+ y when accumulate), where n(x) = x, or with
// norm_w: x * rsqrtf(mean(x^2) + eps) * norm_w (each block recomputes the sum of squares).
// GATED: W is [gate; up] (2 * rows, cols) and y[r] = silu(gate_r . n(x)) * (up_r . n(x)).
// Launch: GEMV_THREADS threads; a row task is R rows shared by KS warps, each summing every
// KS-th run of 32 vectors (split-K, for matrices with few rows and long ones); blocks stride
// over groups of GEMV_WARPS / KS row tasks. Dynamic shared memory cols * 4 bytes.
// WX (warp-local input, for cols <= 32 * gemv_wx_vectors(NR) with KS == 1): each
// warp reads the input into registers, lane l the vectors l + 32 j it multiplies, and computes
// the norm itself, so no block barrier and no shared memory stand between the input and the
// dots; no dynamic shared memory.
// AM (not GATED): the argmax of y too, to `am` (argmax_finish); every block must have a task.
// ROUTED: the rows of the experts `rt` names (gemv_common.cuh's GemvRoute), never WX, no weights
// read before the wait; not GATED, rt.seg % 8 == 0.
// Limits: cols % 8 == 0, cols <= GEMV_MAX_COLS, W, x and norm_w 16-byte aligned, y not x.
template <int R, int KS, bool GATED, bool WX, bool AM, bool ROUTED>
__global__ void __launch_bounds__(GEMV_THREADS, GEMV_MIN_BLOCKS)
gemv_kernel(const uint16_t *__restrict__ w, const float *__restrict__ x, int rows, int cols,
            const uint16_t *__restrict__ bias, const uint16_t *__restrict__ norm_w, float eps, float norm_add,
            int accumulate, float *__restrict__ y, GemvArgmax am, GemvRoute rt) {
    constexpr int NR = GATED ? 2 * R : R;  // weight rows a warp reads together
    constexpr int U = gemv_batch(NR);
    constexpr int NWX = WX ? gemv_wx_vectors(NR) : 1;  // input vectors a lane holds
    constexpr int GROUPS = GEMV_WARPS / KS;  // row tasks per block step
    constexpr int STEP = 32 * KS;            // between a lane's consecutive vectors
    static_assert(!WX || KS == 1, "the warp-local input takes whole rows");
    static_assert(!(AM && GATED), "the argmax is the lm_head's");
    static_assert(!(ROUTED && (WX || AM)), "a routed product stages its input and takes no argmax");
    extern __shared__ float4 xs[];  // [2 * nvec]: x[8v..8v+3] at v, x[8v+4..8v+7] at nvec + v
    __shared__ float red[GEMV_WARPS];
    __shared__ int route_ids[MOE_MAX_USED];  // ROUTED: the block's copy of the route
    __shared__ float route_scale[MOE_MAX_USED];
    __shared__ long long seg_off[MOE_MAX_USED];
    const int nvec = cols / 8;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int group = warp / KS, first = (warp % KS) * 32 + lane;
    const int block_tasks = ((rows + R - 1) / R + GROUPS - 1) / GROUPS;
    const uint4 *wv = reinterpret_cast<const uint4 *>(w);
    const uint4 *nw = reinterpret_cast<const uint4 *>(norm_w);

    pdl_launch_dependents();
    // Before the wait: the first batch of weights of the block's first task. Weights are written
    // by no kernel, so their DRAM latency overlaps the end of the kernel before.
    uint4 first_batch[NR][U];
    if (!ROUTED && blockIdx.x < block_tasks) {
        const uint4 *wr[NR];
        task_rows<R, GATED>(wv, blockIdx.x * GROUPS + group, rows, nvec, wr);
        load_batch<NR, U>(wr, first, STEP, nvec, first_batch);
    }
    pdl_wait();
    const int segv = rt.seg / 8;  // ROUTED, not GATED: a segment's vectors
    if constexpr (ROUTED) {  // seen by every thread after the staging's barrier
        stage_route(rt, route_ids, route_scale);
        if (!GATED && tid < rt.count) seg_off[tid] = (long long)(rt.ids ? rt.ids[tid] : 0) * rows * segv - (long long)tid * segv;
    }

    // WX: lane l's input vectors l + 32 j, normalized in the warp (every warp of the block computes
    // the same sum in the same order).
    float4 wxa[NWX], wxb[NWX];
    if constexpr (WX) {
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        uint4 g[NWX];
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NWX; ++j) {
            const int v = lane + 32 * j;
            wxa[j] = wxb[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            g[j] = make_uint4(0, 0, 0, 0);
            if (v < nvec) {
                wxa[j] = x4[2 * v];
                wxb[j] = x4[2 * v + 1];
                if (norm_w != nullptr) g[j] = nw[v];
            }
        }
        if (norm_w != nullptr) {
#pragma unroll
            for (int j = 0; j < NWX; ++j) ss = add_sq8(ss, wxa[j], wxb[j]);
            const float inv = rsqrtf(warp_sum(ss) / (float)cols + eps);
#pragma unroll
            for (int j = 0; j < NWX; ++j) norm8(wxa[j], wxb[j], inv, g[j], norm_add);
        }
    } else {
        // Stage the input, GEMV_STAGE vectors per thread in flight (a long input would otherwise
        // cost one L2 round trip per GEMV_THREADS vectors); the split into low and high halves
        // keeps the float4 reads of a warp on distinct banks.
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        float ss = 0.0f;
        for (int v0 = tid; v0 < nvec; v0 += GEMV_THREADS * GEMV_STAGE) {
            float4 a[GEMV_STAGE], b[GEMV_STAGE];
#pragma unroll
            for (int k = 0; k < GEMV_STAGE; ++k) {
                const int v = v0 + k * GEMV_THREADS;
                if (v < nvec) {
                    a[k] = x4[2 * v];
                    b[k] = x4[2 * v + 1];
                }
            }
#pragma unroll
            for (int k = 0; k < GEMV_STAGE; ++k) {
                const int v = v0 + k * GEMV_THREADS;
                if (v < nvec) {
                    ss = add_sq8(ss, a[k], b[k]);
                    xs[v] = a[k];
                    xs[nvec + v] = b[k];
                }
            }
        }
        if (norm_w != nullptr) {  // uniform over the block
            ss = block_sum(ss, red);
            const float inv = rsqrtf(ss / (float)cols + eps);
            for (int v0 = tid; v0 < nvec; v0 += GEMV_THREADS * GEMV_STAGE) {
                uint4 g[GEMV_STAGE];
#pragma unroll
                for (int k = 0; k < GEMV_STAGE; ++k) {
                    const int v = v0 + k * GEMV_THREADS;
                    if (v < nvec) g[k] = nw[v];
                }
#pragma unroll
                for (int k = 0; k < GEMV_STAGE; ++k) {
                    const int v = v0 + k * GEMV_THREADS;
                    if (v < nvec) {
                        float4 a = xs[v], b = xs[nvec + v];
                        norm8(a, b, inv, g[k], norm_add);
                        xs[v] = a;
                        xs[nvec + v] = b;
                    }
                }
            }
        }
        __syncthreads();
    }

    ArgmaxSeen seen;  // AM: what this lane saw of the rows it wrote
    // The loop bound is uniform over the block: every warp reaches the barriers below.
    for (int bt = blockIdx.x; bt < block_tasks; bt += gridDim.x) {
        const int task = bt * GROUPS + group;
        const uint4 *wr[NR];
        if constexpr (ROUTED && GATED) {
            routed_task_rows<R>(wv, task, rows, nvec, rt, route_ids, wr);
        } else if constexpr (ROUTED) {
#pragma unroll
            for (int r = 0; r < R; ++r) wr[r] = wv + (size_t)min(task * R + r, rows - 1) * segv;
        } else {
            task_rows<R, GATED>(wv, task, rows, nvec, wr);
        }
        float acc[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
        for (int base = first; base < nvec; base += STEP * U) {
            uint4 wt[NR][U];
            if (!ROUTED && bt == blockIdx.x && base == first) {
#pragma unroll
                for (int r = 0; r < NR; ++r)
#pragma unroll
                    for (int u = 0; u < U; ++u) wt[r][u] = first_batch[r][u];
            } else if constexpr (ROUTED && !GATED) {
                load_routed_batch<NR, U>(wr, base, STEP, nvec, segv, seg_off, wt);
            } else {
                load_batch<NR, U>(wr, base, STEP, nvec, wt);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int v = base + STEP * u;
                if (v < nvec) {
                    // WX: one batch covers the row, so vector v is the lane's u-th
                    const float4 a = WX ? wxa[u < NWX ? u : 0] : xs[v];
                    const float4 b = WX ? wxb[u < NWX ? u : 0] : xs[nvec + v];
#pragma unroll
                    for (int r = 0; r < NR; ++r) acc[r] = dot8(wt[r][u], a, b, acc[r]);
                }
            }
        }
        gemv_finish_task<R, KS, GATED, AM>(acc, task, rows, bias, accumulate, y, seen,
                                           ROUTED && (GATED || bias) ? route_scale : nullptr, rt.seg,
                                           ROUTED ? route_ids : nullptr, rt.count, rt.up);
    }
    if constexpr (AM) argmax_finish<GEMV_WARPS>(seen, am);
}

// What one GEMV launch computes, whatever its shape; with am, the argmax of y too.
struct GemvArgs {
    const uint16_t *w;
    const float *x;
    int rows, cols;
    const uint16_t *bias, *norm_w;
    float eps;
    int accumulate;
    float *y;
    const GemvArgmax *am;
    float norm_add = 0.0f;  // what the norm adds to its weights (norm_plus_one: 1)
    const GemvRoute *route = nullptr;  // a mixture of experts' product (moe.cu)
};

template <int R, int KS, bool GATED, bool WX, bool AM, bool ROUTED = false>
static int launch_gemv_kernel(arc_context *ctx, const GemvArgs &a) {
    auto kernel = gemv_kernel<R, KS, GATED, WX, AM, ROUTED>;
    const size_t smem = WX ? 0 : (size_t)a.cols * sizeof(float);
    int blocks = 0;
    ARC_TRY(gemv_blocks(ctx, kernel, smem, a.rows, R, KS, &blocks));
    const char *name = ROUTED ? "gemv_kernel<routed>" : GATED ? "gemv_kernel<swiglu>" : AM ? "gemv_kernel<argmax>"
                                                                                     : "gemv_kernel";
    return arc_launch_pdl(ctx, name, kernel, dim3(blocks), dim3(GEMV_THREADS), smem, a.w, a.x, a.rows, a.cols,
                          a.bias, a.norm_w, a.eps, a.norm_add, a.accumulate, a.y, a.am ? *a.am : GemvArgmax{},
                          a.route ? *a.route : GemvRoute{});
}

// The instance with the argmax where the launch asks for it.
template <int R, int KS, bool GATED, bool WX = false>
static int launch_gemv_shape(arc_context *ctx, const GemvArgs &a) {
    if constexpr (!GATED) {
        if (a.am) return launch_gemv_kernel<R, KS, GATED, WX, true>(ctx, a);
    }
    return launch_gemv_kernel<R, KS, GATED, WX, false>(ctx, a);
}

// The limits of the bf16 GEMVs: the shared ones, and rows of whole 16-byte vectors.
static int check_gemv(const char *who, const GemvArgs &a) {
    ARC_TRY(check_gemv_io(who, a.w, a.x, a.rows, a.cols, a.norm_w, a.eps, a.y));
    ARC_REQUIRE_AS(who, a.cols > 0 && a.cols % 8 == 0, "cols must be a positive multiple of 8, got %d", a.cols);
    return ARC_OK;
}

// Checks the limits, picks (R, KS) for the shape and launches that instance. GATED reads two
// weight rows per output row, so it takes at most R = 2 (the same 4 rows in flight as R = 4).
template <bool GATED>
static int launch_gemv(arc_context *ctx, const char *who, const GemvArgs &a) {
    ARC_REQUIRE_AS(who, ctx, "ctx is null");
    int st = check_gemv(who, a);
    if (st != ARC_OK) return st;
    if constexpr (GATED) ARC_REQUIRE_AS(who, a.rows <= INT32_MAX / 2, "rows %d too large", a.rows);
    if constexpr (GATED) ARC_REQUIRE_AS(who, a.am == nullptr, "the gated GEMV takes no argmax");
    constexpr int MAX_R = GATED ? 2 : 4;
    // A routed product: one row a task, the input staged, no split over k.
    if (a.route) return launch_gemv_kernel<1, 1, GATED, false, false, true>(ctx, a);
    // Short rows take the warp-local input where one batch of loads covers a row.
    const GemvPlan plan = gemv_plan(ctx, a.rows, a.cols, GATED);
    const int r = plan.r, ks = plan.ks;
    const bool wx = plan.wx;
    if constexpr (MAX_R == 4) {
        if (r == 4 && wx) return launch_gemv_shape<4, 1, GATED, true>(ctx, a);
        if (r == 4) return launch_gemv_shape<4, 1, GATED>(ctx, a);
    }
    if constexpr (!GATED) {
        if (r == 2 && wx) return launch_gemv_shape<2, 1, GATED, true>(ctx, a);
    }
    if (r == 2) return launch_gemv_shape<2, 1, GATED>(ctx, a);
    if (r == 1 && wx) return launch_gemv_shape<1, 1, GATED, true>(ctx, a);
    switch (ks) {
    case 8: return launch_gemv_shape<1, 8, GATED>(ctx, a);
    case 4: return launch_gemv_shape<1, 4, GATED>(ctx, a);
    case 2: return launch_gemv_shape<1, 2, GATED>(ctx, a);
    default: return launch_gemv_shape<1, 1, GATED>(ctx, a);
    }
}

int launch_gemv_rows(arc_context *ctx, const char *who, const uint16_t *w, const GemvIo &io) {
    return launch_gemv<false>(ctx, who, GemvArgs{w, io.x, io.rows, io.cols, io.bias, io.norm_weight, io.eps,
                                                 io.accumulate, io.y, nullptr, io.norm_add});
}

extern "C" int arc_op_gemv(arc_context *ctx, const uint16_t *w, const float *x, int32_t rows, int32_t cols,
                           const uint16_t *bias, const uint16_t *norm_weight, float eps, int32_t accumulate,
                           float *y) {
    return launch_gemv_rows(ctx, __func__, w,
                            {.x = x, .rows = rows, .cols = cols, .bias = bias, .norm_weight = norm_weight, .eps = eps,
                             .accumulate = accumulate, .y = y});
}

// The lm_head of the greedy step: y = W @ rmsnorm(x, norm_weight) and its argmax, committed to
// to.loop (arc_model_forward_commit) or, with to.loop null, written to *to.out and *to.value_out.
int launch_gemv_argmax(arc_context *ctx, const char *who, const uint16_t *w, const GemvIo &io, const ArgmaxTo &to) {
    ARC_REQUIRE_AS(who, ctx, "ctx is null");
    ARC_REQUIRE_AS(who, to.loop != nullptr || to.out != nullptr, "null out");
    GemvArgmax am{ctx->head_argmax, to.loop != nullptr, to.loop ? commit_args(to.loop) : CommitArgs{}, to.out,
                  to.value_out};
    int st = launch_gemv<false>(
        ctx, who, GemvArgs{w, io.x, io.rows, io.cols, nullptr, io.norm_weight, io.eps, 0, io.y, &am, io.norm_add});
    if (st == ARC_OK && to.loop && ctx->capturing) ctx->capture_commits = to.loop;
    return st;
}

extern "C" int arc_op_gemv_argmax(arc_context *ctx, const uint16_t *w, const float *x, int32_t rows, int32_t cols,
                                  const uint16_t *norm_weight, float eps, float *y, int32_t *out, float *value_out) {
    return launch_gemv_argmax(ctx, __func__, w,
                              {.x = x, .rows = rows, .cols = cols, .norm_weight = norm_weight, .eps = eps, .y = y},
                              {.out = out, .value_out = value_out});
}

// arc_op_gemv_swiglu under any arc_activation (the gated GEMV's accumulate slot carries it).
int gemv_glu(arc_context *ctx, const char *who, const uint16_t *w_gate_up, const GemvIo &io) {
    return launch_gemv<true>(ctx, who, GemvArgs{w_gate_up, io.x, io.rows, io.cols, nullptr, io.norm_weight, io.eps,
                                                io.act, io.y, nullptr, io.norm_add});
}

// A routed product over bf16 experts (moe.cu): GATED, y (count * seg) = the chosen experts' GLUs
// of rmsnorm(x) times their scales; else y (rows) += the chosen experts' down projections of x's
// count segments, summed. io.bias: the experts' biases (gemv_finish_task), or null.
int launch_gemv_routed(arc_context *ctx, const char *who, const uint16_t *w, const GemvIo &io, bool gated,
                       const GemvRoute &rt) {
    const GemvArgs a{w, io.x, io.rows, io.cols, io.bias, io.norm_weight, io.eps, gated ? io.act : io.accumulate,
                     io.y, nullptr, io.norm_add, &rt};
    return gated ? launch_gemv<true>(ctx, who, a) : launch_gemv<false>(ctx, who, a);
}

extern "C" int arc_op_gemv_swiglu(arc_context *ctx, const uint16_t *w_gate_up, const float *x, int32_t rows,
                                  int32_t cols, const uint16_t *norm_weight, float eps, float *y) {
    return gemv_glu(ctx, __func__, w_gate_up,
                    {.x = x, .rows = rows, .cols = cols, .norm_weight = norm_weight, .eps = eps, .act = ARC_ACT_SILU,
                     .y = y});
}
