// skinny.cu -- the verify forward's products: up to 8 activation rows (the current token and its
// drafts) through one weight matrix at once, every weight read once for all of them. Like the
// decode's GEMV, this is a stream of bf16 weights through the SMs; its speed is the bandwidth it
// reaches, and the extra rows ride along on tensor cores that are otherwise idle.
//
// Each input is split into ARC_SPLIT_PARTS = 3 bf16 parts, X = X0 + X1 + X2 exactly
// (arc_op_split_rows: a float32 significand is three bf16 significands long), so that every product
// of a weight and a part is exact and only the float32 sums round: acc += W X0, acc' += W X1 + W X2,
// mma.sync m16n8k16.
// The weight rows are the MMA's A operand (16 rows a tile), the activation rows its B operand
// (8 columns; those past `rows` are zeros and never written). Fragments come straight from
// global memory, no shared-memory staging: see skinny_kernel for the k permutation that makes
// one 16-byte load per lane and row feed two MMAs.
//
// How it keeps the memory system busy: a block of 8 warps owns a tile of output rows; its warps
// take interleaved 32-wide k chunks, each lane with 8 independent 16-byte weight loads in flight
// (U chunks x the tile's 2 MT rows of its own), loaded with the no-L1-allocate hint of the GEMV
// since no weight is read twice. The activations (a few hundred KB at most, shared by every
// block) are loaded with ordinary cached loads in the same batch. The first batch of weights is
// issued before the dependency wait. The 8 warps' partial tiles are then summed in shared memory
// in a fixed order (no atomics: the result does not depend on timing), and the epilogue writes.
#include "gemv_common.cuh"

// SKINNY_LOADS: weight loads per lane per batch. SKINNY_MIN_BLOCKS: blocks per SM the kernel is
// compiled to fit (its register budget), as the GEMV's GEMV_MIN_BLOCKS.
enum { SKINNY_THREADS = 256, SKINNY_WARPS = SKINNY_THREADS / 32, SKINNY_MIN_BLOCKS = 2, SKINNY_LOADS = 8 };
enum { SKINNY_MAX_ROWS = 8, SKINNY_K = 32 };  // activation rows at most (the MMA's n8); k per chunk
enum { SPLIT_THREADS = 256 };

enum SkinnyEpilogue { SKINNY_STORE = 0, SKINNY_ACCUMULATE = 1, SKINNY_SWIGLU = 2 };

struct SkinnyArgs {
    const uint16_t *x;        // (ARC_SPLIT_PARTS, rows, k) bf16: the input's parts
    const uint16_t *w;        // (n, k) bf16; SWIGLU: (2 n, k), [Wg; Wu]
    int rows, n, k;
    const uint16_t *bias;     // (n) or null; STORE only
    float *y;                 // (rows, n): STORE, ACCUMULATE
    uint16_t *h;              // (ARC_SPLIT_PARTS, rows, n): SWIGLU, h split as the input is
    int act;                  // SWIGLU: the arc_activation of the GLU
};

// v = bf16(v) + bf16(r1) + bf16(r2) exactly, r1 = v - p0, r2 = r1 - p1 (each difference exact in
// float32; __fsub_rn keeps it from fusing with the product that made v). Non-finite v gives
// non-finite parts.
__device__ __forceinline__ void split3(float v, uint16_t (&part)[ARC_SPLIT_PARTS]) {
    part[0] = f32_to_bf16(v);
    const float r1 = __fsub_rn(v, bf16_to_f32(part[0]));
    part[1] = f32_to_bf16(r1);
    part[2] = f32_to_bf16(__fsub_rn(r1, bf16_to_f32(part[1])));
}

// The weight row that tile row `r` (0..15) of A operand m holds in the block whose first output
// is n0. Plain: MT consecutive 16-row tiles. SWIGLU: m = 0 the gate rows, m = 1 the up rows of
// the same 16 outputs. Rows past the end re-read the last row; their results are never written.
template <int EPI>
__device__ __forceinline__ size_t skinny_row(int m, int r, int n0, int n) {
    if constexpr (EPI == SKINNY_SWIGLU) {
        const int out = min(n0 + r, n - 1);
        return m == 0 ? (size_t)out : (size_t)n + out;
    } else {
        return (size_t)min(n0 + 16 * m + r, n - 1);
    }
}

// The lane's weight vectors of the warp's chunks j0 .. j0 + U - 1 (zeros past `count`), all
// loads issued before any use. wp[m][h]: row g + 8 h of A operand m at the warp's first chunk.
template <int MT, int U>
__device__ __forceinline__ void skinny_load_w(const uint4 *const (&wp)[MT][2], int j0, int count,
                                              uint4 (&wt)[U][MT][2]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int j = j0 + u;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                wt[u][m][h] = j < count ? load_nc128(wp[m][h] + (size_t)j * (SKINNY_WARPS * SKINNY_K / 8))
                                        : make_uint4(0, 0, 0, 0);
    }
}

// Y tile of (X0 + X1 + X2) W^T: MT A operands of 16 weight rows, 8 activation rows; epilogue EPI.
// Launch: ceil(n / OUT) blocks of SKINNY_THREADS threads, OUT = 16 (SWIGLU) or 16 MT outputs.
//
// The k permutation. In a 32-wide k chunk, lane (g = lane / 4, t = lane % 4) loads 8 consecutive
// bf16 (one uint4, words x y z w, element e at k = 8 t + e, the lower e in a word's low half) of
// W row g, of W row g + 8 and of X row g (each part). m16n8k16 wants, with kk its own k
// index 0..15: A a0 (row g, kk 2t, 2t+1), a1 (row g+8, kk 2t, 2t+1), a2 (row g, kk 2t+8, 2t+9),
// a3 (row g+8, kk 2t+8, 2t+9); B b0 (kk 2t, 2t+1, col g), b1 (kk 2t+8, 2t+9, col g); C c0 c1
// (row g, cols 2t, 2t+1), c2 c3 (row g+8, cols 2t, 2t+1). MMA 0 takes words x, y of every
// uint4: a = {W[g].x, W[g+8].x, W[g].y, W[g+8].y}, b = {X[g].x, X[g].y}; MMA 1 words z, w.
// So in MMA 0, kk = 2t + i is k = 8t + i and kk = 2t + 8 + i is k = 8t + 2 + i (i = 0, 1); in
// MMA 1 the same plus 4. Consistent: the map from kk to k depends on kk alone (kk fixes t, and
// t is the same lane group in A and in B, for every row and every column), so each product
// pairs W[row, k] with X[col, k] of the same k; and the two MMAs' maps together cover the 32 k
// of the chunk once each. A dot product over k does not depend on the order of its k, so the
// sums are those of the unpermuted product. (Were the halves of a word swapped in the
// fragment's convention, A and B would swap alike, and the pairing would still hold.)
template <int MT, int EPI>
__global__ void __launch_bounds__(SKINNY_THREADS, SKINNY_MIN_BLOCKS) skinny_kernel(SkinnyArgs p) {
    constexpr int U = SKINNY_LOADS / (2 * MT);                      // k chunks a batch
    constexpr int OUT = EPI == SKINNY_SWIGLU ? 16 : 16 * MT;       // outputs a block
    constexpr int STEP = SKINNY_WARPS * SKINNY_K / 8;              // uint4 between a warp's chunks
    static_assert(EPI != SKINNY_SWIGLU || MT == 2, "SWIGLU holds the gate and the up tile");
    __shared__ float part[SKINNY_WARPS][MT * 128];  // the warps' tiles: [(m * 16 + row) * 8 + col]
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int n0 = blockIdx.x * OUT;
    const int chunks = p.k / SKINNY_K;
    const int count = warp < chunks ? (chunks - warp + SKINNY_WARPS - 1) / SKINNY_WARPS : 0;
    const size_t kv = (size_t)p.k / 8;              // uint4 per row
    const int first = warp * (SKINNY_K / 8) + t;     // the lane's uint4 in a row, warp's chunk 0

    pdl_launch_dependents();
    // Before the wait: the first batch of weights, which no kernel writes. Under a branch, as in
    // the GEMV: without one, ptxas predicates the loads and schedules them after the wait.
    const uint4 *wp[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            wp[m][h] = reinterpret_cast<const uint4 *>(p.w) + skinny_row<EPI>(m, g + 8 * h, n0, p.n) * kv + first;
    uint4 wt[U][MT][2] = {};
    if (count > 0) skinny_load_w<MT, U>(wp, 0, count, wt);
    pdl_wait();

    // Activation row g of each part; lanes past `rows` hold zeros (B's columns past rows).
    const bool has_x = g < p.rows;
    const uint4 *xp[ARC_SPLIT_PARTS];
#pragma unroll
    for (int q = 0; q < ARC_SPLIT_PARTS; ++q)
        xp[q] = reinterpret_cast<const uint4 *>(p.x) + ((size_t)q * p.rows + (has_x ? g : 0)) * kv + first;
    // Four independent sums a tile (MMA 0 or 1; part 0, or parts 1 and 2), so that MMAs do not
    // wait on each other, and the small parts are summed apart from the large one.
    float acc[MT][4][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int c = 0; c < 4; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][c][e] = 0.0f;

    for (int j0 = 0; j0 < count; j0 += U) {
        if (j0 > 0) skinny_load_w<MT, U>(wp, j0, count, wt);
        uint4 xs[U][ARC_SPLIT_PARTS];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const bool ok = has_x && j0 + u < count;
            const size_t off = (size_t)(j0 + u) * STEP;
#pragma unroll
            for (int q = 0; q < ARC_SPLIT_PARTS; ++q) xs[u][q] = ok ? xp[q][off] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (j0 + u >= count) break;  // uniform over the warp
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                const uint4 r0 = wt[u][m][0], r8 = wt[u][m][1];
                const uint32_t a0[4] = {r0.x, r8.x, r0.y, r8.y};  // MMA 0: elements 0..3
                const uint32_t a1[4] = {r0.z, r8.z, r0.w, r8.w};  // MMA 1: elements 4..7
                mma_bf16_16816(acc[m][0], a0, xs[u][0].x, xs[u][0].y);
                mma_bf16_16816(acc[m][1], a0, xs[u][1].x, xs[u][1].y);
                mma_bf16_16816(acc[m][1], a0, xs[u][2].x, xs[u][2].y);
                mma_bf16_16816(acc[m][2], a1, xs[u][0].z, xs[u][0].w);
                mma_bf16_16816(acc[m][3], a1, xs[u][1].z, xs[u][1].w);
                mma_bf16_16816(acc[m][3], a1, xs[u][2].z, xs[u][2].w);
            }
        }
    }

    // The warp's tile to shared memory: c0 c1 at (row g, cols 2t, 2t + 1), c2 c3 at row g + 8.
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        float c[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) c[e] = (acc[m][0][e] + acc[m][1][e]) + (acc[m][2][e] + acc[m][3][e]);
        float *d = part[warp] + m * 128;
        *reinterpret_cast<float2 *>(d + g * 8 + 2 * t) = make_float2(c[0], c[1]);
        *reinterpret_cast<float2 *>(d + (g + 8) * 8 + 2 * t) = make_float2(c[2], c[3]);
    }
    __syncthreads();

    // Thread i: activation row r = i / OUT, output n0 + i % OUT (consecutive threads, consecutive
    // outputs); the warps' partial sums added in warp order.
    const int i = threadIdx.x, r = i / OUT, o = i % OUT, col = n0 + o;
    if (i >= 8 * OUT || r >= p.rows || col >= p.n) return;
    if constexpr (EPI == SKINNY_SWIGLU) {
        float gs = 0.0f, us = 0.0f;
#pragma unroll
        for (int w = 0; w < SKINNY_WARPS; ++w) {
            gs += part[w][o * 8 + r];
            us += part[w][128 + o * 8 + r];
        }
        uint16_t part[ARC_SPLIT_PARTS];
        split3(glu(gs, us, p.act), part);
#pragma unroll
        for (int q = 0; q < ARC_SPLIT_PARTS; ++q) p.h[((size_t)q * p.rows + r) * p.n + col] = part[q];
    } else {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < SKINNY_WARPS; ++w) s += part[w][o * 8 + r];  // o * 8 = (m * 16 + row) * 8
        float *dst = p.y + (size_t)r * p.n + col;
        if constexpr (EPI == SKINNY_ACCUMULATE) s += *dst;
        else if (p.bias != nullptr) s += bf16_to_f32(p.bias[col]);
        *dst = s;
    }
}

// The parts (rows, cols each) of v = n(x): v = p0 + p1 + p2 exactly (split3), n the GEMV's fused
// RMSNorm (x * rsqrtf(mean(x^2) + eps) * norm_w, as rmsnorm_rows in prefill.cu) or, with norm_w
// null, the identity. One block per row. Limits: cols % 8 == 0; x, norm_w and parts 16-byte aligned.
__global__ void __launch_bounds__(SPLIT_THREADS)
split_rows_kernel(const float *__restrict__ x, int rows, int cols, const uint16_t *__restrict__ norm_w, float eps,
                  float norm_add, uint16_t *__restrict__ parts) {
    __shared__ float red[SPLIT_THREADS / 32];
    pdl_launch_dependents();
    pdl_wait();  // x is the previous kernel's output
    const int row = blockIdx.x, nvec = cols / 8;
    const float4 *xr = reinterpret_cast<const float4 *>(x + (size_t)row * cols);
    float inv = 1.0f;
    if (norm_w != nullptr) {  // uniform over the block
        float ss = 0.0f;
        for (int v = threadIdx.x; v < nvec; v += SPLIT_THREADS) {
            ss = add_sq8(ss, xr[2 * v], xr[2 * v + 1]);
        }
        ss = block_sum(ss, red);
        inv = rsqrtf(ss / (float)cols + eps);
    }
    const uint4 *nw = reinterpret_cast<const uint4 *>(norm_w);
    for (int v = threadIdx.x; v < nvec; v += SPLIT_THREADS) {
        const float4 a = xr[2 * v], b = xr[2 * v + 1];
        float e[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        if (norm_w != nullptr) {
            const uint4 gw = nw[v];
            const uint32_t gws[4] = {gw.x, gw.y, gw.z, gw.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
                e[i] = e[i] * inv * (norm_add + (i % 2 ? bf16_hi(gws[i / 2]) : bf16_lo(gws[i / 2])));
        }
        uint16_t q[8][ARC_SPLIT_PARTS];
#pragma unroll
        for (int i = 0; i < 8; ++i) split3(e[i], q[i]);
#pragma unroll
        for (int k = 0; k < ARC_SPLIT_PARTS; ++k) {
            uint4 out;
            out.x = (uint32_t)q[0][k] | (uint32_t)q[1][k] << 16;
            out.y = (uint32_t)q[2][k] | (uint32_t)q[3][k] << 16;
            out.z = (uint32_t)q[4][k] | (uint32_t)q[5][k] << 16;
            out.w = (uint32_t)q[6][k] | (uint32_t)q[7][k] << 16;
            reinterpret_cast<uint4 *>(parts + ((size_t)k * rows + row) * cols)[v] = out;
        }
    }
}

// The tile height, by shape; only speed depends on it. Two 16-row A operands a block (MT = 2)
// halve the activation loads per weight byte (each X fragment feeds both), but halve the blocks
// too: taken only where 32-row tiles still fill every SM's SKINNY_MIN_BLOCKS slots four times
// over (on an H200, n >= 33,792: the lm_head). The others keep 16-row tiles, which for the
// products that matter give 256 (n = 4,096) to 384 (n = 6,144) blocks, about one full wave of
// 2 x 132 slots or more (SwiGLU's 2 x 14,336 rows: 896 blocks of 16 outputs each).
static int skinny_tiles(const arc_context *ctx, int32_t n) {
    const long long tiles32 = ((long long)n + 31) / 32;
    return tiles32 >= 4LL * ctx->sm_count * SKINNY_MIN_BLOCKS ? 2 : 1;
}

template <int MT, int EPI>
static int launch_skinny(arc_context *ctx, const SkinnyArgs &p) {
    constexpr int OUT = EPI == SKINNY_SWIGLU ? 16 : 16 * MT;
    const long long blocks = ((long long)p.n + OUT - 1) / OUT;  // n <= INT32_MAX: fits the grid's x
    const char *name = EPI == SKINNY_SWIGLU ? "skinny_kernel<swiglu>" : "skinny_kernel";
    return arc_launch_pdl(ctx, name, skinny_kernel<MT, EPI>, dim3((unsigned)blocks), dim3(SKINNY_THREADS), 0, p);
}

// The limits both products share; `who` names the entry point.
static int check_skinny(const char *who, const arc_context *ctx, const SkinnyArgs &p) {
    ARC_REQUIRE_AS(who, ctx, "ctx is null");
    ARC_REQUIRE_AS(who, p.x && p.w, "null pointer (x and w are required)");
    ARC_REQUIRE_AS(who, p.rows >= 1 && p.rows <= SKINNY_MAX_ROWS, "rows must be in 1..%d, got %d", SKINNY_MAX_ROWS,
                   p.rows);
    ARC_REQUIRE_AS(who, p.n > 0, "n must be positive, got %d", p.n);
    ARC_REQUIRE_AS(who, p.k > 0 && p.k % SKINNY_K == 0, "k must be a positive multiple of %d, got %d", SKINNY_K, p.k);
    ARC_REQUIRE_AS(who, (uintptr_t)p.x % 16 == 0 && (uintptr_t)p.w % 16 == 0, "x and w must be 16-byte aligned");
    return ARC_OK;
}

int split_rows(arc_context *ctx, const char *who, const float *x, int32_t rows, int32_t cols,
               const uint16_t *norm_weight, float eps, float norm_add, uint16_t *parts) {
    ARC_REQUIRE_AS(who, ctx, "ctx is null");
    ARC_REQUIRE_AS(who, x && parts, "null pointer (x and parts are required)");
    ARC_REQUIRE_AS(who, rows >= 1 && rows <= SKINNY_MAX_ROWS, "rows must be in 1..%d, got %d", SKINNY_MAX_ROWS, rows);
    ARC_REQUIRE_AS(who, cols > 0 && cols % 8 == 0, "cols must be a positive multiple of 8, got %d", cols);
    ARC_REQUIRE_AS(who, (uintptr_t)x % 16 == 0 && (uintptr_t)parts % 16 == 0 && (uintptr_t)norm_weight % 16 == 0,
                   "x, norm_weight and parts must be 16-byte aligned");
    ARC_REQUIRE_AS(who, norm_weight == nullptr || eps > 0.0f, "eps must be positive, got %g", (double)eps);
    ARC_REQUIRE_AS(who, (const void *)parts != (const void *)x, "parts and x must be distinct");
    return arc_launch_pdl(ctx, "split_rows_kernel", split_rows_kernel, dim3(rows), dim3(SPLIT_THREADS), 0, x, rows,
                          cols, norm_weight, eps, norm_add, parts);
}

extern "C" int arc_op_split_rows(arc_context *ctx, const float *x, int32_t rows, int32_t cols,
                                 const uint16_t *norm_weight, float eps, uint16_t *parts) {
    return split_rows(ctx, __func__, x, rows, cols, norm_weight, eps, 0.0f, parts);
}

extern "C" int arc_op_skinny(arc_context *ctx, const uint16_t *x, const uint16_t *w, int32_t rows, int32_t n,
                             int32_t k, const uint16_t *bias, int32_t accumulate, float *y) {
    const SkinnyArgs p = {x, w, rows, n, k, bias, y, nullptr};
    ARC_TRY(check_skinny(__func__, ctx, p));
    ARC_REQUIRE(y, "null pointer (y is required)");
    ARC_REQUIRE(!(bias && accumulate), "bias and accumulate do not combine (the forward uses one or the other)");
    ARC_REQUIRE((uintptr_t)y % 8 == 0, "y must be 8-byte aligned");
    ARC_REQUIRE((const void *)y != (const void *)x && (const void *)y != (const void *)w, "y must not alias x or w");
    const int mt = skinny_tiles(ctx, n);
    if (accumulate)
        return mt == 2 ? launch_skinny<2, SKINNY_ACCUMULATE>(ctx, p) : launch_skinny<1, SKINNY_ACCUMULATE>(ctx, p);
    return mt == 2 ? launch_skinny<2, SKINNY_STORE>(ctx, p) : launch_skinny<1, SKINNY_STORE>(ctx, p);
}

int skinny_glu(arc_context *ctx, const char *who, const uint16_t *x, const uint16_t *w_gate_up, int32_t rows,
               int32_t n, int32_t k, int act, uint16_t *h) {
    const SkinnyArgs p = {x, w_gate_up, rows, n, k, nullptr, nullptr, h, act};
    ARC_TRY(check_skinny(who, ctx, p));
    ARC_REQUIRE_AS(who, h, "null pointer (h is required)");
    ARC_REQUIRE_AS(who, n % 8 == 0 && n <= INT32_MAX / 2, "n must be a multiple of 8 (and 2 n an int32), got %d", n);
    ARC_REQUIRE_AS(who, (uintptr_t)h % 2 == 0, "h must be 2-byte aligned");
    ARC_REQUIRE_AS(who, (const void *)h != (const void *)x, "h must not alias x");
    return launch_skinny<2, SKINNY_SWIGLU>(ctx, p);
}

extern "C" int arc_op_skinny_swiglu(arc_context *ctx, const uint16_t *x, const uint16_t *w_gate_up, int32_t rows,
                                    int32_t n, int32_t k, uint16_t *h) {
    return skinny_glu(ctx, __func__, x, w_gate_up, rows, n, k, ARC_ACT_SILU, h);
}
