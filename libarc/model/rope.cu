// rope.cu -- rotary position embedding of q and k, fused with storing this position's k and v
// into the bf16 KV cache.
#include "kernels.cuh"

enum { ROPE_THREADS = 128 };

// qkv = [q (n_heads, hd) | k (n_kv_heads, hd) | v (n_kv_heads, hd)] float32, as the fused QKV
// GEMV writes it. Rotate-half RoPE: element i pairs with i + hd/2, angle = float(pos) *
// inv_freq[i]. q and k are rotated in place; then k and v are rounded to bf16 (nearest even)
// into k_cache / v_cache at [kv_head][pos][:] (layout (n_kv_heads, max_seq, hd)).
// Launch: one thread per pair, ceil((n_heads + n_kv_heads) * hd/2 / ROPE_THREADS) blocks.
// A position outside [0, max_seq) writes nothing to the cache and NaN into q and k.
// Limits: hd even and <= 128.
__global__ void __launch_bounds__(ROPE_THREADS)
rope_kv_kernel(float *__restrict__ qkv, int n_heads, int n_kv_heads, int hd,
               const float *__restrict__ inv_freq, const int32_t *__restrict__ pos_ptr, int max_seq,
               uint16_t *__restrict__ k_cache, uint16_t *__restrict__ v_cache) {
    pdl_launch_dependents();
    pdl_wait();
    const int half = hd / 2;
    const int p = blockIdx.x * ROPE_THREADS + threadIdx.x;
    if (p >= (n_heads + n_kv_heads) * half) return;
    const int head = p / half, i = p % half;
    const int pos = *pos_ptr;
    const bool valid = pos >= 0 && pos < max_seq;
    float *h = qkv + (size_t)head * hd;  // k heads follow the q heads
    const float a = h[i], b = h[i + half];
    float ra, rb;
    if (valid) {
        float s, c;
        sincosf(__fmul_rn((float)pos, inv_freq[i]), &s, &c);
        // Written out with explicit roundings: no fused multiply-add, as the reference computes.
        ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        rb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    } else {
        ra = rb = __uint_as_float(0x7fc00000u);
    }
    h[i] = ra;
    h[i + half] = rb;
    if (head < n_heads || !valid) return;
    const int kv = head - n_heads;
    const size_t at = ((size_t)kv * max_seq + pos) * hd;
    const float *v = qkv + (size_t)(n_heads + n_kv_heads + kv) * hd;
    k_cache[at + i] = f32_to_bf16(ra);
    k_cache[at + i + half] = f32_to_bf16(rb);
    v_cache[at + i] = f32_to_bf16(v[i]);
    v_cache[at + i + half] = f32_to_bf16(v[i + half]);
}

extern "C" int arc_op_rope_kv(arc_context *ctx, float *qkv, int32_t n_heads, int32_t n_kv_heads,
                       int32_t head_dim, const float *inv_freq, const int32_t *pos, int32_t max_seq,
                       uint16_t *k_cache, uint16_t *v_cache) {
    ARC_REQUIRE(ctx, "ctx is null");
    ARC_REQUIRE(qkv && inv_freq && pos && k_cache && v_cache,
                "null pointer (qkv, inv_freq, pos, k_cache and v_cache are required)");
    ARC_REQUIRE(n_heads > 0 && n_kv_heads > 0, "head counts must be positive, got %d and %d",
                n_heads, n_kv_heads);
    ARC_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && head_dim <= ATTN_MAX_HEAD_DIM,
                "head_dim must be even and in [2, %d], got %d", ATTN_MAX_HEAD_DIM, head_dim);
    ARC_REQUIRE(max_seq > 0, "max_seq must be positive, got %d", max_seq);
    const long long pairs = (long long)(n_heads + (long long)n_kv_heads) * (head_dim / 2);
    ARC_REQUIRE(pairs <= (1LL << 30), "too many heads (%d + %d)", n_heads, n_kv_heads);
    const int blocks = (int)((pairs + ROPE_THREADS - 1) / ROPE_THREADS);
    return arc_launch_pdl(ctx, "rope_kv_kernel", rope_kv_kernel, dim3(blocks), dim3(ROPE_THREADS), 0, qkv, n_heads,
                          n_kv_heads, head_dim, inv_freq, pos, max_seq, k_cache, v_cache);
}

