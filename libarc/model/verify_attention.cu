// verify_attention.cu -- attention for the rows of a speculative step's verify forward: the current
// token and the drafts, at positions p..p+k read on the device. Two kernels: the first rotates
// every row's k (the decode's rotate-half RoPE, the same roundings) and stores it and v to the
// cache at the row's position; the second is the decode's attention kernel over every row
// (attention.cu, ROWS; attention_wide.cu for heads past 256 elements), which reads the rows
// before a row's position from the cache, the earlier drafts' included, and so computes at each
// position what the decode step computes there, bit for bit. The store kernel also stores the
// decode's own row where the heads are past 256 elements (attention.cu: attention_layer).
//
// A row whose position is at or past max_seq (drafts near the end of the context) writes nothing
// to the cache and NaN to its output, as the decode does there; the accept stops before it.
#include "kernels.cuh"
#include "kv_cache.cuh"

enum { VSTORE_THREADS = 128 };

// Row i = blockIdx.x of qkv (rows, q | k | v), float32 and unrotated, kv head blockIdx.y: k rotated
// at positions[i] as `rope` says (kernels.cuh), in the cache's form (rounded to bf16, or q8_0: a
// warp a block of 32), into cache row positions[i], and v with it, when that row is below max_seq.
// qkv is left as it is. Limits: hd <= ATTN_MAX_HEAD_DIM.
__global__ void __launch_bounds__(VSTORE_THREADS)
verify_store_kernel(const float *__restrict__ qkv, int stride, const int32_t *__restrict__ positions,
                    const RopeArgs rope, const KvCache kv, int n_heads, int n_kv_heads, int hd, int max_seq) {
    __shared__ float cs[ATTN_MAX_HEAD_DIM / 2], sn[ATTN_MAX_HEAD_DIM / 2];
    pdl_launch_dependents();
    pdl_wait();
    const int i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, pos = positions[i];
    if (pos < 0 || pos >= max_seq) return;
    for (int t = tid; t < rope.half; t += VSTORE_THREADS) rope_angles(rope, pos, t, &sn[t], &cs[t]);
    __syncthreads();
    const float *k = qkv + (size_t)i * stride + (size_t)(n_heads + h) * hd, *v = k + (size_t)n_kv_heads * hd;
    const size_t at = ((size_t)h * max_seq + pos) * hd;
    for (int d = tid; d < hd; d += VSTORE_THREADS) {  // q8_0: hd % 32 == 0, whole warps a pass
        const float kx = rope_rotate_half(k, d, rope.half, cs, sn);
        if (kv.q8()) {
            q8_store_warp(kx, static_cast<int8_t *>(kv.k), kv.k_scale, h, pos, d, hd, max_seq);
            q8_store_warp(v[d], static_cast<int8_t *>(kv.v), kv.v_scale, h, pos, d, hd, max_seq);
        } else {
            static_cast<uint16_t *>(kv.k)[at + d] = f32_to_bf16(kx);
            static_cast<uint16_t *>(kv.v)[at + d] = f32_to_bf16(v[d]);
        }
    }
}

int launch_kv_store(arc_context *ctx, const float *qkv, int rows, int stride, const int32_t *positions,
                    const RopeArgs &rope, const KvCache &kv, int n_heads, int n_kv_heads, int hd, int max_seq) {
    ARC_REQUIRE(hd > 0 && hd <= ATTN_MAX_HEAD_DIM && rope.half >= 1 && 2 * rope.half <= hd,
                "RoPE of %d pairs in a head of %d (at most %d)", rope.half, hd, ATTN_MAX_HEAD_DIM);
    ARC_REQUIRE(!kv.q8() || hd % KV_Q8_BLOCK == 0, "a q8_0 cache takes head_dim %% %d == 0, got %d", KV_Q8_BLOCK, hd);
    return arc_launch_pdl(ctx, "verify_store_kernel", verify_store_kernel, dim3(rows, n_kv_heads), dim3(VSTORE_THREADS),
                          0, qkv, stride, positions, rope, kv, n_heads, n_kv_heads, hd, max_seq);
}

int launch_verify_attention(arc_context *ctx, const float *qkv, int rows, int stride, const int32_t *positions,
                            const AttnSpec &spec, const KvCache &kv, int n_heads, int n_kv_heads,
                            int hd, int max_seq, float *scratch, unsigned *done, float *out) {
    ARC_REQUIRE(hd <= ATTN_TILE_MAX_HEAD_DIM || (!kv.q8() && hd % 8 == 0),
                "head_dim %d past %d takes a bf16 cache and a multiple of 8", hd, ATTN_TILE_MAX_HEAD_DIM);
    if (!spec.cached)
        ARC_TRY(launch_kv_store(ctx, qkv, rows, stride, positions, spec.rope, kv, n_heads, n_kv_heads, hd, max_seq));
    return attention_layer(ctx, qkv, spec, kv, n_heads, n_kv_heads, hd, max_seq, positions, scratch, out,
                           AttnRows{rows, stride, done});
}
