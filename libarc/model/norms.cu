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
    ARC_REQUIRE(a.qkv && a.q_norm && a.k_norm, "null pointer (qkv, q_norm and k_norm are required)");
    ARC_REQUIRE(rows > 0 && n_heads > 0 && n_kv_heads > 0, "rows %d, n_heads %d, n_kv_heads %d must be positive",
                rows, n_heads, n_kv_heads);
    ARC_REQUIRE(head_dim > 0 && head_dim <= ATTN_MAX_HEAD_DIM, "head_dim must be in [1, %d], got %d",
                ATTN_MAX_HEAD_DIM, head_dim);
    const int64_t tasks = (int64_t)rows * (n_heads + n_kv_heads + (a.v_norm ? n_kv_heads : 0));
    const unsigned blocks = (unsigned)((tasks + HNORM_WARPS - 1) / HNORM_WARPS);
    return arc_launch_pdl(ctx, "head_norm_kernel", head_norm_kernel, dim3(blocks), dim3(HNORM_THREADS), 0, a.qkv,
                          (int)rows, (int)a.stride, (int)n_heads, (int)n_kv_heads, (int)head_dim, a.q_norm, a.k_norm,
                          a.eps, a.norm_add, (int)a.v_norm);
}

enum { ADDNORM_THREADS = 256 };

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
        const float4 a = row[2 * v], b = row[2 * v + 1];
        const uint4 g = wv[v];
        float4 xa = out[2 * v], xb = out[2 * v + 1];
        xa.x += a.x * inv * (add + bf16_lo(g.x)); xa.y += a.y * inv * (add + bf16_hi(g.x));
        xa.z += a.z * inv * (add + bf16_lo(g.y)); xa.w += a.w * inv * (add + bf16_hi(g.y));
        xb.x += b.x * inv * (add + bf16_lo(g.z)); xb.y += b.y * inv * (add + bf16_hi(g.z));
        xb.z += b.z * inv * (add + bf16_lo(g.w)); xb.w += b.w * inv * (add + bf16_hi(g.w));
        out[2 * v] = xa;
        out[2 * v + 1] = xb;
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
