// verify_attention.cu -- attention for the rows of a speculative step's verify forward: the current
// token and the drafts, at positions p..p+k read on the device. Two kernels: the first rotates
// every row's q and k (the decode's rotate-half RoPE, same roundings) and writes k and v to the
// cache, so that the second can attend each row over every cache row up to its position, the new
// rows of earlier drafts included. Scores, softmax and the weighted sum stay in float32 (q is not
// rounded, nor are the probabilities), as in the decode's attention, so a verify row computes what
// the decode step would compute at that position up to the order of the sums.
//
// A row whose position is at or past max_seq (drafts near the end of the context) writes nothing
// to the cache and attends over the rows up to max_seq - 1: its output is never committed.
#include <math.h>

#include "kernels.cuh"

enum { VROPE_THREADS = 128, VATT_THREADS = 128, VATT_WARPS = VATT_THREADS / 32, VATT_MAX_HD = ATTN_MAX_HEAD_DIM };

// Row i = blockIdx.x of qkv (rows, q | k | v), float32, rotated in place (q and k) at position
// positions[i] as `rope` says (kernels.cuh); k and v rounded to bf16 into cache row positions[i]
// when it is below max_seq.
__global__ void __launch_bounds__(VROPE_THREADS)
verify_rope_kernel(float *__restrict__ qkv, int stride, const int32_t *__restrict__ positions, const RopeArgs rope,
                   uint16_t *__restrict__ k_cache, uint16_t *__restrict__ v_cache, int n_heads, int n_kv_heads, int hd,
                   int max_seq) {
    __shared__ float cs[VATT_MAX_HD / 2], sn[VATT_MAX_HD / 2];
    pdl_launch_dependents();
    pdl_wait();
    const int i = blockIdx.x, half = rope.half, tid = threadIdx.x;
    const int pos = positions[i];
    const bool store = pos >= 0 && pos < max_seq;
    for (int t = tid; t < half; t += VROPE_THREADS) rope_angles(rope, pos, t, &sn[t], &cs[t]);
    __syncthreads();
    float *row = qkv + (size_t)i * stride;
    const int q_dim = n_heads * hd, kv_dim = n_kv_heads * hd;
    // Pairs (d, d + half) of every q and k head, rotated together so the rotation can be in place.
    for (int idx = tid; idx < (n_heads + n_kv_heads) * half; idx += VROPE_THREADS) {
        const int h = idx / half, d = idx % half;
        float *x = row + h * hd;  // q heads, then k heads (they follow q in the row)
        const float x0 = x[d], x1 = x[d + half];
        x[d] = __fsub_rn(__fmul_rn(x0, cs[d]), __fmul_rn(x1, sn[d]));
        x[d + half] = __fadd_rn(__fmul_rn(x1, cs[d]), __fmul_rn(x0, sn[d]));
    }
    if (!store) return;
    __syncthreads();  // k rotated (and its unrotated elements as they are) before it is stored
    for (int e = tid; e < kv_dim; e += VROPE_THREADS) {
        const int h = e / hd, d = e % hd;
        const size_t at = ((size_t)h * max_seq + pos) * hd + d;
        k_cache[at] = f32_to_bf16(row[q_dim + e]);
        v_cache[at] = f32_to_bf16(row[q_dim + kv_dim + e]);
    }
}

// out[i] (n_heads, hd) float32 for row i = blockIdx.y, head blockIdx.x: softmax(q k^T * scale) v
// over cache rows 0..min(positions[i], max_seq - 1) (windowed: the last `window` of them). Each warp takes every VATT_WARPS-th block of 32
// positions: a lane scores one position (its whole k row against q in shared memory), the warp
// rescales its running sum (online softmax, base 2), then adds the 32 weighted v rows, a lane
// holding elements lane + 32 e of the output. The warps' partials are combined in a fixed order.
// Limits: hd % 8 == 0, hd <= 128; caches 16-byte aligned.
__global__ void __launch_bounds__(VATT_THREADS)
verify_attention_kernel(const float *__restrict__ qkv, int stride, const int32_t *__restrict__ positions,
                        const uint16_t *__restrict__ k_cache, const uint16_t *__restrict__ v_cache, int n_heads,
                        int n_kv_heads, int hd, int max_seq, float scale_log2, int window, float *__restrict__ out) {
    constexpr int E = VATT_MAX_HD / 32;
    __shared__ __align__(16) float q[VATT_MAX_HD];
    __shared__ float wm[VATT_WARPS], wl[VATT_WARPS], wacc[VATT_WARPS][VATT_MAX_HD];
    pdl_launch_dependents();
    pdl_wait();
    const int head = blockIdx.x, i = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int kvh = head / (n_heads / n_kv_heads);
    const int last = min(positions[i], max_seq - 1);
    const int n = last < 0 ? 1 : last + 1;
    const int lo = window > 0 && n > window ? n - window : 0;  // a windowed row attends lo..last
    for (int d = tid; d < hd; d += VATT_THREADS) q[d] = qkv[(size_t)i * stride + head * hd + d];
    __syncthreads();
    const uint16_t *kb = k_cache + (size_t)kvh * max_seq * hd, *vb = v_cache + (size_t)kvh * max_seq * hd;
    float m = -INFINITY, l = 0.0f, acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    for (int b0 = lo + warp * 32; b0 < n; b0 += VATT_WARPS * 32) {
        const int j = b0 + lane;
        float s = -INFINITY;
        if (j < n) {
            const uint4 *kr = reinterpret_cast<const uint4 *>(kb + (size_t)j * hd);
            float dot = 0.0f;
            for (int v = 0; v < hd / 8; ++v) {
                const uint4 g = kr[v];
                const float4 qa = *reinterpret_cast<const float4 *>(q + 8 * v);
                const float4 qb = *reinterpret_cast<const float4 *>(q + 8 * v + 4);
                dot = dot8(g, qa, qb, dot);
            }
            s = dot * scale_log2;
        }
        const float nm = fmaxf(m, warp_max(s));  // finite: position b0 < n is in this block
        const float corr = exp2f(m - nm), p = j < n ? exp2f(s - nm) : 0.0f;
        l = l * corr + warp_sum(p);
        m = nm;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] *= corr;
        const int count = min(32, n - b0);
        for (int jj = 0; jj < count; ++jj) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const uint16_t *vr = vb + (size_t)(b0 + jj) * hd;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const int d = lane + 32 * e;
                if (d < hd) acc[e] = fmaf(pj, bf16_to_f32(vr[d]), acc[e]);
            }
        }
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < E; ++e)
        if (lane + 32 * e < hd) wacc[warp][lane + 32 * e] = acc[e];
    __syncthreads();
    float big = wm[0];
    for (int w = 1; w < VATT_WARPS; ++w) big = fmaxf(big, wm[w]);
    float total = 0.0f, f[VATT_WARPS];
    for (int w = 0; w < VATT_WARPS; ++w) {
        f[w] = wl[w] > 0.0f ? exp2f(wm[w] - big) : 0.0f;  // a warp with no positions adds nothing
        total += wl[w] * f[w];
    }
    for (int d = tid; d < hd; d += VATT_THREADS) {
        float o = 0.0f;
        for (int w = 0; w < VATT_WARPS; ++w) o += wacc[w][d] * f[w];
        out[((size_t)i * n_heads + head) * hd + d] = o / total;
    }
}

int launch_verify_attention(arc_context *ctx, float *qkv, int rows, int stride, const int32_t *positions,
                            const AttnSpec &spec, uint16_t *k_cache, uint16_t *v_cache, int n_heads,
                            int n_kv_heads, int hd, int max_seq, float *out) {
    ARC_REQUIRE(hd % 8 == 0 && hd <= VATT_MAX_HD, "head_dim must be a multiple of 8 and at most %d, got %d",
                VATT_MAX_HD, hd);
    const RopeArgs &rope = spec.rope;
    ARC_REQUIRE(rope.half >= 1 && 2 * rope.half <= hd, "RoPE of %d pairs in a head of %d", rope.half, hd);
    ARC_TRY(arc_launch_pdl(ctx, "verify_rope_kernel", verify_rope_kernel, dim3(rows), dim3(VROPE_THREADS), 0, qkv,
                           stride, positions, rope, k_cache, v_cache, n_heads, n_kv_heads, hd, max_seq));
    const float scale_log2 = (float)(1.4426950408889634 * spec.scale);
    return arc_launch_pdl(ctx, "verify_attention_kernel", verify_attention_kernel, dim3(n_heads, rows),
                          dim3(VATT_THREADS), 0, (const float *)qkv, stride, positions, (const uint16_t *)k_cache,
                          (const uint16_t *)v_cache, n_heads, n_kv_heads, hd, max_seq, scale_log2, spec.window, out);
}
