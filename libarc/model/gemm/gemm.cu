// gemm.cu -- the prefill's matrix products on tensor cores: C = A W^T with A the chunk's
// activations (m tokens, bf16) and W a weight matrix as the model stores it (rows of k, bf16),
// float32 sums, and the epilogue the forward needs fused in (bias, residual add, SwiGLU).
//
// mma.sync m16n8k16 (sm_80+, also what sm_90 runs), fed by ldmatrix from shared memory that a
// multi-stage cp.async pipeline fills; 16-byte chunks of each 128-byte tile row are XOR-swizzled
// by the row so that the eight rows one ldmatrix reads fall on distinct banks. One kernel template,
// four tile shapes: large tiles for long products, small ones so that short products (a small
// model, a short chunk) still occupy every SM. Choosing the shape is all that depends on speed.
// On an sm_90 GPU the products large enough to fill it go to gemm_sm90.cu instead (TMA and wgmma).
#include "gemm_sm90.cuh"
#include "gemm_tile.cuh"

// One stage: the A rows [m0, m0 + BM) (gemm_tile.cuh) and the W tile's rows, columns [k0, k0 +
// GEMM_BK); chunks past the weight rows or k are zero-filled.
template <class T, int EPI>
__device__ __forceinline__ void load_stage(const GemmArgs &p, uint16_t *sa, uint16_t *sw, int m0, int block_n,
                                           int k0, int tid) {
    load_a_stage<T>(p, sa, m0, k0, tid);
    const uint32_t w_base = smem_addr(sw);
    const uint16_t *w = (const uint16_t *)p.w;
#pragma unroll
    for (int i = 0; i < T::BN * GEMM_CHUNKS / T::THREADS; ++i) {
        const int idx = tid + i * T::THREADS, row = idx / GEMM_CHUNKS, chunk = idx % GEMM_CHUNKS;
        const int k = k0 + chunk * 8;
        const int wrow = weight_row<T, EPI>(row, block_n, p.n, p.up_rows ? p.up_rows : p.n);
        const bool ok = wrow >= 0 && k < p.k;
        const uint16_t *src = ok ? w + (size_t)wrow * p.k + k : w;
        cp_async16(w_base + tile_offset(row, chunk) * 2, src, ok);
    }
}

// C tile (blockIdx.x, blockIdx.y) of A W^T, epilogue EPI. Launch: grid (ceil(m / BM), ceil(n_w /
// BN)) with n_w the rows of W (2 n for SWIGLU), T::THREADS threads, T::SMEM bytes of dynamic
// shared memory. The M tiles vary fastest: blocks resident together share a W tile, which is then
// read from DRAM once while A (a chunk of activations, a few MB) stays in L2; the other order
// reads the whole weight matrix once per M tile. Limits: k % 8 == 0, a and w 16-byte aligned; c
// 8-byte aligned.
// Grouped (p.offsets): grid z the experts; a block past its expert's rows returns at once.
template <class T, int EPI>
__global__ void __launch_bounds__(T::THREADS, T::MIN_BLOCKS) gemm_kernel(GemmArgs p) {
    extern __shared__ __align__(128) uint16_t smem[];
    uint16_t *sa = smem, *sw = smem + T::STAGES * T::BM * GEMM_BK;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = warp / T::WARPS_N, wn = warp % T::WARPS_N;
    const int m0 = blockIdx.x * T::BM, block_n = blockIdx.y;
    const int k_tiles = (p.k + GEMM_BK - 1) / GEMM_BK;

    pdl_launch_dependents();
    pdl_wait();  // A is the previous kernel's output
    group_weights(p);
    if (!group_rows(p, m0)) return;

#pragma unroll
    for (int s = 0; s < T::STAGES - 1; ++s) {
        if (s < k_tiles)
            load_stage<T, EPI>(p, sa + s * T::BM * GEMM_BK, sw + s * T::BN * GEMM_BK, m0, block_n, s * GEMM_BK, tid);
        cp_async_commit();
    }

    float acc[T::MI][T::NI][4];
#pragma unroll
    for (int i = 0; i < T::MI; ++i)
#pragma unroll
        for (int j = 0; j < T::NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<T::STAGES - 2>();
        __syncthreads();  // stage kt has landed for every thread; stage kt - 1 is free to refill
        const int next = kt + T::STAGES - 1;
        if (next < k_tiles) {
            const int s = next % T::STAGES;
            load_stage<T, EPI>(p, sa + s * T::BM * GEMM_BK, sw + s * T::BN * GEMM_BK, m0, block_n, next * GEMM_BK,
                               tid);
        }
        cp_async_commit();

        const int s = kt % T::STAGES;
        const uint32_t a_base = smem_addr(sa + s * T::BM * GEMM_BK), w_base = smem_addr(sw + s * T::BN * GEMM_BK);
        mma_stage<T>(a_base, w_base, wm, wn, lane, p.m - m0 - wm * T::WM, acc);
    }
    cp_async_wait<0>();

    store_tile<T, EPI>(p, acc, m0, block_n, wm, wn, lane);
}

// The tile shapes (see docs/PERF.md for how they were chosen and measured).
using TileL = GemmTile<128, 256, 2, 4, 3, 1>;  // long products: 64x64 per warp
using TileM = GemmTile<128, 128, 2, 4, 3, 2>;
using TileS = GemmTile<64, 128, 2, 2, 4, 2>;
using TileXS = GemmTile<64, 64, 2, 2, 4, 3>;   // short products: many blocks

template <class T, int EPI>
static int launch_tile(arc_context *ctx, const GemmArgs &p) {
    auto kernel = gemm_kernel<T, EPI>;
    if (T::SMEM > 48 * 1024)  // a host-side attribute, legal while capturing
        ARC_CUDA(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::SMEM));
    const int n_w = EPI == EPI_SWIGLU ? 2 * p.n : p.n;
    const dim3 grid((p.m + T::BM - 1) / T::BM, (n_w + T::BN - 1) / T::BN, p.offsets ? p.groups : 1);
    return arc_launch_pdl(ctx, "gemm_kernel", kernel, grid, dim3(T::THREADS), (size_t)T::SMEM, p);
}

enum { TILE_L, TILE_M, TILE_S, TILE_XS, TILE_COUNT };

// The tile shape for a product of m x n_w, by two regimes measured on the H200 (docs/PERF.md).
// A product that fills every SM with 128 x 128 tiles runs TileM or TileL, whichever leaves fewer
// tile-areas on the busiest SM (ties to TileM: its two blocks per SM hide each other's stalls).
// A smaller one is latency-bound: it takes the smallest tiles that are still all resident at
// once (TileXS, three per SM; else TileS, two), since more concurrent blocks finish it sooner.
static int pick_tile(const arc_context *ctx, int m, int n_w) {
    auto tiles = [&](int bm, int bn) { return (long long)((m + bm - 1) / bm) * ((n_w + bn - 1) / bn); };
    const long long sms = ctx->sm_count;
    const long long m_tiles = tiles(128, 128);
    if (m_tiles < sms) {
        if (tiles(64, 64) <= 3 * sms) return TILE_XS;
        if (tiles(64, 128) <= 2 * sms) return TILE_S;
        return TILE_M;
    }
    const long long m_load = (m_tiles + sms - 1) / sms, l_load = 2 * ((tiles(128, 256) + sms - 1) / sms);
    return l_load < m_load ? TILE_L : TILE_M;
}

template <int EPI>
static int launch_gemm(arc_context *ctx, const GemmArgs &p, int tile) {
    switch (tile) {
    case TILE_L: return launch_tile<TileL, EPI>(ctx, p);
    case TILE_M: return launch_tile<TileM, EPI>(ctx, p);
    case TILE_S: return launch_tile<TileS, EPI>(ctx, p);
    default: return launch_tile<TileXS, EPI>(ctx, p);
    }
}

int check_gemm(const char *who, const GemmArgs &p, int epilogue) {
    if (p.m <= 0 || p.n <= 0) return arc_fail(ARC_INVALID_ARGUMENT, who, "m and n must be positive, got %d and %d", p.m, p.n);
    if (p.k <= 0 || p.k % 8 != 0) return arc_fail(ARC_INVALID_ARGUMENT, who, "k must be a positive multiple of 8, got %d", p.k);
    if ((uintptr_t)p.a % 16 != 0 || (uintptr_t)p.w % 16 != 0)
        return arc_fail(ARC_INVALID_ARGUMENT, who, "a and w must be 16-byte aligned");
    const int n_w = epilogue == EPI_SWIGLU ? 2 * p.n : p.n;
    if (n_w > GEMM_MAX_N) return arc_fail(ARC_INVALID_ARGUMENT, who, "W has %d rows, more than %d", n_w, GEMM_MAX_N);
    return ARC_OK;
}

// Whether a product of m x n_w runs on gemm_sm90.cu: on an sm_90 GPU, when it has at least half
// a wave of that kernel's 128 x 256 tiles (measured on the H200, docs/PERF.md: 1.3 to 2.3x this
// file's kernel on the 1B and 8B products, even with SmolLM2's gate/up, behind it on the smaller
// ones) and more than one tile of rows (its clusters pair two along m: a 128-token prompt's
// prefill took 25.2-25.6 ms on it against 22.2-22.7 here, llama8B-q8 and -q4km), and float32
// rows of whole 16-byte vectors.
static bool on_sm90(const arc_context *ctx, int m, int n_w) {
    if (!gemm_sm90_available(ctx) || n_w % 4 != 0 || m <= 128) return false;
    const long long tiles = (long long)((m + 127) / 128) * ((n_w + 255) / 256);
    return 2 * tiles >= ctx->sm_count;
}

// Checks the arguments common to every entry point (their pointers are checked already), picks
// the kernel (gemm_quant.cu's for packed weights) and the tile shape, and launches.
static int gemm_checked(arc_context *ctx, const char *who, int32_t format, const GemmArgs &p, int epilogue) {
    if (!ctx) return arc_fail(ARC_INVALID_ARGUMENT, who, "ctx is null");
    ARC_TRY(check_gemm(who, p, epilogue));
    if (format != ARC_FORMAT_BF16) return gemm_quant(ctx, who, format, p, epilogue);
    const int n_w = epilogue == EPI_SWIGLU ? 2 * p.n : p.n;
    if (epilogue != EPI_SWIGLU && !p.bias && p.ldc == p.n && (uintptr_t)p.c % 16 == 0 && on_sm90(ctx, p.m, n_w))
        return gemm_sm90(ctx, who, (const uint16_t *)p.w,
                         {.a = p.a, .m = p.m, .n = p.n, .k = p.k, .accumulate = epilogue == EPI_ACCUMULATE, .c = p.c});
    const int tile = pick_tile(ctx, p.m, n_w);
    if (epilogue == EPI_SWIGLU) return launch_gemm<EPI_SWIGLU>(ctx, p, tile);
    if (epilogue == EPI_ACCUMULATE) return launch_gemm<EPI_ACCUMULATE>(ctx, p, tile);
    return launch_gemm<EPI_STORE>(ctx, p, tile);
}

int gemm_grouped(arc_context *ctx, const char *who, int32_t format, const GemmArgs &p, int epilogue) {
    ARC_REQUIRE_AS(who, ctx && p.offsets && p.a && p.w && (p.c || p.h), "null argument");
    ARC_REQUIRE_AS(who, p.groups >= 1 && p.groups <= 65535, "groups must be in 1..65535, got %d", p.groups);
    ARC_REQUIRE_AS(who, epilogue == EPI_STORE || epilogue == EPI_SWIGLU, "a grouped product stores or gates");
    ARC_TRY(check_gemm(who, p, epilogue));
    if (format != ARC_FORMAT_BF16) return gemm_quant(ctx, who, format, p, epilogue);
    if (epilogue == EPI_SWIGLU) return launch_tile<TileXS, EPI_SWIGLU>(ctx, p);
    return launch_tile<TileXS, EPI_STORE>(ctx, p);
}

// c (m, ldc) columns [0, n) = a W^T (+ bias) (+ c): the checks of arc_op_gemm_bf16, then the product.
static int gemm_into(arc_context *ctx, const char *who, int32_t format, const void *w, const GemmIo &io) {
    const uint16_t *a = io.a;
    float *c = io.c;
    ARC_REQUIRE_AS(who, a && w && c, "null pointer (a, w and c are required)");
    ARC_REQUIRE_AS(who, (uintptr_t)c % 8 == 0, "c must be 8-byte aligned");
    ARC_REQUIRE_AS(who, (const void *)c != (const void *)a && (const void *)c != w, "c must not alias a or w");
    ARC_REQUIRE_AS(who, io.ldc >= io.n, "ldc %d is less than n %d", io.ldc, io.n);
    const GemmArgs p = {w, a, io.m, io.n, io.k, io.bias, c, io.ldc, nullptr, 0};
    return gemm_checked(ctx, who, format, p, io.accumulate ? EPI_ACCUMULATE : EPI_STORE);
}

// h (m, n) = bf16(act(a Wg^T) * (a Wu^T)): the checks of arc_op_gemm_swiglu_bf16, then the product.
static int gemm_glu(arc_context *ctx, const char *who, int32_t format, const void *w_gate_up, const GemmIo &io) {
    const uint16_t *a = io.a;
    const int32_t n = io.n;
    uint16_t *h = io.h;
    ARC_REQUIRE_AS(who, a && w_gate_up && h, "null pointer (a, w_gate_up and h are required)");
    ARC_REQUIRE_AS(who, n % 2 == 0 && n <= INT32_MAX / 2, "n must be even (and 2 n an int32), got %d", n);
    ARC_REQUIRE_AS(who, (uintptr_t)h % 4 == 0, "h must be 4-byte aligned");
    ARC_REQUIRE_AS(who, (const void *)h != (const void *)a, "h must not alias a");
    const GemmArgs p = {w_gate_up, a, io.m, n, io.k, nullptr, nullptr, n, h, io.act};
    return gemm_checked(ctx, who, format, p, EPI_SWIGLU);
}

extern "C" int arc_op_gemm_bf16(arc_context *ctx, const uint16_t *a, const uint16_t *w, int32_t m, int32_t n,
                                int32_t k, const uint16_t *bias, int32_t accumulate, float *c) {
    return gemm_into(ctx, __func__, ARC_FORMAT_BF16, w,
                     {.a = a, .m = m, .n = n, .k = k, .bias = bias, .accumulate = accumulate, .c = c, .ldc = n});
}

extern "C" int arc_op_gemm_swiglu_bf16(arc_context *ctx, const uint16_t *a, const uint16_t *w_gate_up, int32_t m,
                                       int32_t n, int32_t k, uint16_t *h) {
    return gemm_glu(ctx, __func__, ARC_FORMAT_BF16, w_gate_up,
                    {.a = a, .m = m, .n = n, .k = k, .act = ARC_ACT_SILU, .h = h});
}

extern "C" int arc_op_gemm_q(arc_context *ctx, int32_t format, const uint16_t *a, const void *w, int32_t m, int32_t n,
                             int32_t k, const uint16_t *bias, int32_t accumulate, float *c) {
    return gemm_into(ctx, __func__, format, w,
                     {.a = a, .m = m, .n = n, .k = k, .bias = bias, .accumulate = accumulate, .c = c, .ldc = n});
}

extern "C" int arc_op_gemm_swiglu_q(arc_context *ctx, int32_t format, const uint16_t *a, const void *w_gate_up,
                                    int32_t m, int32_t n, int32_t k, uint16_t *h) {
    return gemm_glu(ctx, __func__, format, w_gate_up, {.a = a, .m = m, .n = n, .k = k, .act = ARC_ACT_SILU, .h = h});
}

int gemm_weight(arc_context *ctx, const char *who, Weight w, const GemmIo &io) {
    return gemm_into(ctx, who, w.format, w.p, io);
}

int gemm_glu_weight(arc_context *ctx, const char *who, Weight w, const GemmIo &io) {
    return gemm_glu(ctx, who, w.format, w.p, io);
}

// ---- SwiGLU from a float32 product: the prefill's gate/up on gemm_sm90.cu ----------------------

enum { SWIGLU_THREADS = 256 };

// h[r, j] = bf16(act(s[r, j]) * s[r, n + j]) for r < rows, j < n (n even): s the product
// a [Wg; Wu]^T (rows, 2 n) float32, h (rows, n) bf16; the formula of gemm_kernel's SWIGLU epilogue.
__global__ void __launch_bounds__(SWIGLU_THREADS)
swiglu_rows_kernel(const float *__restrict__ s, int rows, int n, int act, uint16_t *__restrict__ h) {
    pdl_launch_dependents();
    pdl_wait();
    const long long pairs = (long long)rows * (n / 2);
    for (long long i = blockIdx.x * (long long)SWIGLU_THREADS + threadIdx.x; i < pairs;
         i += (long long)gridDim.x * SWIGLU_THREADS) {
        const long long r = i / (n / 2), j = 2 * (i % (n / 2));
        const float2 g = *reinterpret_cast<const float2 *>(s + r * 2 * n + j);
        const float2 u = *reinterpret_cast<const float2 *>(s + r * 2 * n + n + j);
        *reinterpret_cast<uint32_t *>(h + r * n + j) = pack_bf16x2(glu(g.x, u.x, act), glu(g.y, u.y, act));
    }
}

int gemm_swiglu_rows(arc_context *ctx, const char *who, const uint16_t *w_gate_up, const GemmIo &io, float *scratch,
                     int32_t scratch_rows) {
    const uint16_t *a = io.a;
    const int32_t m = io.m, n = io.n, k = io.k;
    const int act = io.act;
    uint16_t *h = io.h;
    if (!scratch || scratch_rows <= 0 || !on_sm90(ctx, m < scratch_rows ? m : scratch_rows, 2 * n) ||
        (uintptr_t)scratch % 16 != 0)
        return gemm_glu(ctx, who, ARC_FORMAT_BF16, w_gate_up, io);
    ARC_REQUIRE_AS(who, n % 2 == 0 && k % 8 == 0 && m > 0, "bad shape m %d, n %d, k %d", m, n, k);
    for (int32_t r0 = 0; r0 < m; r0 += scratch_rows) {
        const int32_t rows = m - r0 < scratch_rows ? m - r0 : scratch_rows;
        ARC_TRY(gemm_sm90(ctx, who, w_gate_up, {.a = a + (size_t)r0 * k, .m = rows, .n = 2 * n, .k = k, .c = scratch}));
        const long long pairs = (long long)rows * (n / 2), most = (long long)ctx->sm_count * 8;
        const long long blocks = (pairs + SWIGLU_THREADS - 1) / SWIGLU_THREADS;
        ARC_TRY(arc_launch_pdl(ctx, "swiglu_rows_kernel", swiglu_rows_kernel, dim3((unsigned)(blocks < most ? blocks : most)),
                               dim3(SWIGLU_THREADS), 0, (const float *)scratch, rows, n, act, h + (size_t)r0 * n));
    }
    return ARC_OK;
}
