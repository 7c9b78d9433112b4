// norms.cu -- the norms of the layer program that no product fuses: the per-head norm of q and k
// (ARC_OP_QK_NORM), and the post-norm of a product's output before its residual add. After the QKV
// projection, before RoPE, each head of q and of k is RMS-normed over its head_dim elements by
// its own weights (and, with v_norm, each head of v without weights). The decode, the verify and the prefill all hold q and k as float32 rows of
// [q | k | v], so one kernel serves the three.
#include "device_math.cuh"
#include "launch.cuh"
#include "model/attention_ops.cuh"
#include "norms.cuh"

enum { HNORM_THREADS = 128, HNORM_WARPS = HNORM_THREADS / 32, HNORM_PER_LANE = ATTN_MAX_HEAD_DIM / 32 };

// One warp a (row, head): x = qkv[row] + head * hd, x = x * rsqrt(mean(x^2) + eps) * w in place,
// w = q_norm for heads 0..n_heads - 1, k_norm for the n_kv_heads k heads after them, and with
// v_norm 1 for the n_kv_heads v heads after those (else v is untouched).
// Launch: ceil(rows * heads / HNORM_WARPS) blocks of HNORM_THREADS, heads = n_heads + n_kv_heads
// (+ n_kv_heads with v_norm). Limits: hd <= ATTN_MAX_HEAD_DIM.
__global__ void __launch_bounds__(HNORM_THREADS)
head_norm_kernel(float *__restrict__ qkv, int rows, int stride, int n_heads, int n_kv_heads, int hd,
                 const uint16_t *__restrict__ q_norm, const uint16_t *__restrict__ k_norm, float eps, float add,
                 int v_norm) {
    pdl_launch_dependents();
    pdl_wait();  // qkv is the projection's output
    const int heads = n_heads + n_kv_heads + (v_norm ? n_kv_heads : 0), lane = threadIdx.x % 32;
    const int task = blockIdx.x * HNORM_WARPS + threadIdx.x / 32;
    if (task >= rows * heads) return;
    const int r = task / heads, h = task % heads;
    float *x = qkv + (size_t)r * stride + (size_t)h * hd;
    const uint16_t *w = h < n_heads ? q_norm : k_norm;
    float v[HNORM_PER_LANE], ss = 0.0f;
#pragma unroll
    for (int e = 0; e < HNORM_PER_LANE; ++e) {
        const int d = lane + 32 * e;
        v[e] = d < hd ? x[d] : 0.0f;
        ss = fmaf(v[e], v[e], ss);
    }
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / (float)hd + eps);
    const bool value = h >= n_heads + n_kv_heads;
#pragma unroll
    for (int e = 0; e < HNORM_PER_LANE; ++e) {
        const int d = lane + 32 * e;
        if (d < hd) x[d] = value ? v[e] * inv : v[e] * inv * (add + bf16_to_f32(w[d]));
    }
}

int launch_head_norm(arc_context *ctx, const HeadNormArgs &a) {
    const int32_t rows = a.rows, n_heads = a.n_heads, n_kv_heads = a.n_kv_heads, head_dim = a.head_dim;
    ARC_REQUIRE(a.qkv && a.q_norm && (a.k_norm || n_kv_heads == 0),
                "null pointer (qkv, q_norm and, with kv heads, k_norm are required)");
    ARC_REQUIRE(rows > 0 && n_heads > 0 && n_kv_heads >= 0, "rows %d and n_heads %d must be positive, n_kv_heads %d not "
                "negative", rows, n_heads, n_kv_heads);
    ARC_REQUIRE(head_dim > 0 && head_dim <= ATTN_MAX_HEAD_DIM, "head_dim must be in [1, %d], got %d",
                ATTN_MAX_HEAD_DIM, head_dim);
    const int64_t tasks = (int64_t)rows * (n_heads + n_kv_heads + (a.v_norm ? n_kv_heads : 0));
    const unsigned blocks = (unsigned)((tasks + HNORM_WARPS - 1) / HNORM_WARPS);
    return arc_launch_pdl(ctx, "head_norm_kernel", head_norm_kernel, dim3(blocks), dim3(HNORM_THREADS), 0, a.qkv,
                          (int)rows, (int)a.stride, (int)n_heads, (int)n_kv_heads, (int)head_dim, a.q_norm, a.k_norm,
                          a.eps, a.norm_add, (int)a.v_norm);
}

enum { ADDNORM_THREADS = 256 };

// x[0..1] (8 floats) += (a, b) * inv * (add + w), w the 8 bf16 weights of g: a normed row's
// elements added to the residual stream.
__device__ __forceinline__ void add_normed8(float4 *x, float4 a, float4 b, uint4 g, float inv, float add) {
    float4 xa = x[0], xb = x[1];
    xa.x += a.x * inv * (add + bf16_lo(g.x)); xa.y += a.y * inv * (add + bf16_hi(g.x));
    xa.z += a.z * inv * (add + bf16_lo(g.y)); xa.w += a.w * inv * (add + bf16_hi(g.y));
    xb.x += b.x * inv * (add + bf16_lo(g.z)); xb.y += b.y * inv * (add + bf16_hi(g.z));
    xb.z += b.z * inv * (add + bf16_lo(g.w)); xb.w += b.w * inv * (add + bf16_hi(g.w));
    x[0] = xa;
    x[1] = xb;
}

// x[r] += t[r] * rsqrt(mean(t[r]^2) + eps) * w, one block a row r (dim floats): the output of the
// attention's or the FFN's last product normed before its residual add. The squares are summed in
// add_sq8's order. Limits: dim % 8 == 0; x, t and w 16-byte aligned.
__global__ void __launch_bounds__(ADDNORM_THREADS)
add_norm_rows_kernel(float *__restrict__ x, const float *__restrict__ t, int dim, const uint16_t *__restrict__ w,
                     float eps, float add) {
    __shared__ float red[ADDNORM_THREADS / 32];
    pdl_launch_dependents();
    pdl_wait();  // t is the product's output
    const int r = blockIdx.x, nvec = dim / 8;
    const float4 *row = reinterpret_cast<const float4 *>(t + (size_t)r * dim);
    float4 *out = reinterpret_cast<float4 *>(x + (size_t)r * dim);
    float ss = 0.0f;
    for (int v = threadIdx.x; v < nvec; v += ADDNORM_THREADS) ss = add_sq8(ss, row[2 * v], row[2 * v + 1]);
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)dim + eps);
    const uint4 *wv = reinterpret_cast<const uint4 *>(w);
    for (int v = threadIdx.x; v < nvec; v += ADDNORM_THREADS) {
        add_normed8(out + 2 * v, row[2 * v], row[2 * v + 1], wv[v], inv, add);
    }
}

int launch_add_norm_rows(arc_context *ctx, float *x, const float *t, int32_t rows, int32_t dim, const RmsNorm &norm) {
    const uint16_t *w = norm.w;
    ARC_REQUIRE(x && t && w, "null pointer (x, t and w are required)");
    ARC_REQUIRE(rows > 0 && dim > 0 && dim % 8 == 0, "rows %d must be positive, dim %d a positive multiple of 8", rows,
                dim);
    ARC_REQUIRE((uintptr_t)x % 16 == 0 && (uintptr_t)t % 16 == 0 && (uintptr_t)w % 16 == 0,
                "x, t and w must be 16-byte aligned");
    return arc_launch_pdl(ctx, "add_norm_rows_kernel", add_norm_rows_kernel, dim3(rows), dim3(ADDNORM_THREADS), 0, x,
                          t, (int)dim, w, norm.eps, norm.add);
}

// The 8 elements at vector v of a * ia * (add + wa) + b * ib * (add + wb): the dense FFN's output
// and the experts' each normed (their factors ia, ib), summed.
__device__ __forceinline__ void beside_sum8(const float4 *a, const float4 *b, const uint4 *wa, const uint4 *wb,
                                            int v, float ia, float ib, float add, float4 &lo, float4 &hi) {
    const float4 a0 = a[2 * v], a1 = a[2 * v + 1], b0 = b[2 * v], b1 = b[2 * v + 1];
    const uint4 ga = wa[v], gb = wb[v];
    lo.x = a0.x * ia * (add + bf16_lo(ga.x)) + b0.x * ib * (add + bf16_lo(gb.x));
    lo.y = a0.y * ia * (add + bf16_hi(ga.x)) + b0.y * ib * (add + bf16_hi(gb.x));
    lo.z = a0.z * ia * (add + bf16_lo(ga.y)) + b0.z * ib * (add + bf16_lo(gb.y));
    lo.w = a0.w * ia * (add + bf16_hi(ga.y)) + b0.w * ib * (add + bf16_hi(gb.y));
    hi.x = a1.x * ia * (add + bf16_lo(ga.z)) + b1.x * ib * (add + bf16_lo(gb.z));
    hi.y = a1.y * ia * (add + bf16_hi(ga.z)) + b1.y * ib * (add + bf16_hi(gb.z));
    hi.z = a1.z * ia * (add + bf16_lo(ga.w)) + b1.z * ib * (add + bf16_lo(gb.w));
    hi.w = a1.w * ia * (add + bf16_hi(ga.w)) + b1.w * ib * (add + bf16_hi(gb.w));
}

// x[r] += rmsnorm(rmsnorm(a[r], wa) + rmsnorm(b[r], wb), w), one block a row r (dim floats): the
// dense FFN's output a and the experts' b of a layer with the experts beside its FFN. The sum is
// made twice (for its squares, then for x) by the same arithmetic, so it is never stored. Limits:
// dim % 8 == 0; x, a, b and the weights 16-byte aligned.
__global__ void __launch_bounds__(ADDNORM_THREADS)
add_norm_pair_rows_kernel(float *__restrict__ x, const float *__restrict__ a, const float *__restrict__ b, int dim,
                          const uint16_t *__restrict__ wa, const uint16_t *__restrict__ wb,
                          const uint16_t *__restrict__ w, float eps, float add) {
    __shared__ float red[ADDNORM_THREADS / 32];
    pdl_launch_dependents();
    pdl_wait();  // a and b are the products' outputs
    const int r = blockIdx.x, nvec = dim / 8;
    const float4 *ra = reinterpret_cast<const float4 *>(a + (size_t)r * dim);
    const float4 *rb = reinterpret_cast<const float4 *>(b + (size_t)r * dim);
    const uint4 *ga = reinterpret_cast<const uint4 *>(wa), *gb = reinterpret_cast<const uint4 *>(wb);
    float sa = 0.0f, sb = 0.0f;
    for (int v = threadIdx.x; v < nvec; v += ADDNORM_THREADS) {
        sa = add_sq8(sa, ra[2 * v], ra[2 * v + 1]);
        sb = add_sq8(sb, rb[2 * v], rb[2 * v + 1]);
    }
    sa = block_sum(sa, red);
    sb = block_sum(sb, red);
    const float ia = rsqrtf(sa / (float)dim + eps), ib = rsqrtf(sb / (float)dim + eps);
    float su = 0.0f;
    for (int v = threadIdx.x; v < nvec; v += ADDNORM_THREADS) {
        float4 lo, hi;
        beside_sum8(ra, rb, ga, gb, v, ia, ib, add, lo, hi);
        su = add_sq8(su, lo, hi);
    }
    su = block_sum(su, red);
    const float inv = rsqrtf(su / (float)dim + eps);
    const uint4 *wv = reinterpret_cast<const uint4 *>(w);
    float4 *out = reinterpret_cast<float4 *>(x + (size_t)r * dim);
    for (int v = threadIdx.x; v < nvec; v += ADDNORM_THREADS) {
        float4 lo, hi;
        beside_sum8(ra, rb, ga, gb, v, ia, ib, add, lo, hi);
        add_normed8(out + 2 * v, lo, hi, wv[v], inv, add);
    }
}

int launch_add_norm_pair_rows(arc_context *ctx, float *x, const float *a, const float *b, int32_t rows, int32_t dim,
                              const NormPair &n) {
    ARC_REQUIRE(x && a && b && n.a.w && n.b.w && n.out.w, "null pointer (x, a, b and the three norms are required)");
    ARC_REQUIRE(rows > 0 && dim > 0 && dim % 8 == 0, "rows %d must be positive, dim %d a positive multiple of 8", rows,
                dim);
    ARC_REQUIRE((uintptr_t)x % 16 == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 &&
                    (uintptr_t)n.a.w % 16 == 0 && (uintptr_t)n.b.w % 16 == 0 && (uintptr_t)n.out.w % 16 == 0,
                "x, a, b and the norms' weights must be 16-byte aligned");
    ARC_REQUIRE(n.a.eps == n.out.eps && n.b.eps == n.out.eps && n.a.add == n.out.add && n.b.add == n.out.add,
                "the three norms must share eps and their weights' offset");
    return arc_launch_pdl(ctx, "add_norm_pair_rows_kernel", add_norm_pair_rows_kernel, dim3(rows),
                          dim3(ADDNORM_THREADS), 0, x, a, b, (int)dim, n.a.w, n.b.w, n.out.w, n.out.eps, n.out.add);
}
