// attention_ops.cuh -- a layer's attention as the forwards launch it: its limits, its RoPE and
// spec, the rows of one launch, and the launchers (attention.cu, verify_attention.cu,
// prefill_attention.cu).
#pragma once

#include <stdint.h>

#include "internal.cuh"

// Attention's limits (the decode's blocks take tiles of 64 positions: attention.cu). Heads of up to
// ATTN_TILE_MAX_HEAD_DIM elements go to the tensor-core kernels (attention.cu, prefill_attention.cu);
// wider ones, up to ATTN_MAX_HEAD_DIM, a multiple of 8, over a bf16 cache, to attention_wide.cu.
enum { ATTN_MAX_SEQ = 1 << 20, ATTN_TILE_MAX_HEAD_DIM = 256, ATTN_MAX_HEAD_DIM = 512 };

// A layer's KV cache (arc_model.h: arc_kv_form; kv_cache.cuh reads and writes it). bf16: k and v
// (n_kv_heads, max_seq, hd) bf16, the scales null. q8_0: k and v (n_kv_heads, max_seq, hd) int8
// codes; k_scale and v_scale (n_kv_heads, kv_seq_pad(max_seq), hd / 32) float16 bits; wide,
// (2, n_kv_heads, max_seq, hd) bf16, where the prefill widens the rows it attends (k's, then v's;
// one buffer the layers take in turn).
struct KvCache {
    void *k = nullptr, *v = nullptr;
    uint16_t *k_scale = nullptr, *v_scale = nullptr;
    uint16_t *wide = nullptr;
    __host__ __device__ bool q8() const { return k_scale != nullptr; }
};

// The rows a kv head's q8_0 scales take: max_seq rounded up to whole tiles of 64 positions, so that
// a tile's scales are one 16-byte aligned run inside the allocation.
enum { KV_PAD_ROWS = 64 };
__host__ __device__ inline int kv_seq_pad(int max_seq) { return (max_seq + KV_PAD_ROWS - 1) / KV_PAD_ROWS * KV_PAD_ROWS; }

// The launchers are the arc_op_* entry points of arc.h; shapes and limits are documented at
// each kernel. Bytes of scratch arc_op_attention needs for these shapes (0 if invalid).
uint64_t arc_attention_scratch_bytes(int32_t n_heads, int32_t head_dim, int32_t max_seq);

// A layer's RoPE as the attention kernels apply it: the layer's frequencies (half of them), the
// rotated elements 0..2 half - 1 of a head (the rest pass unrotated), and the factor cos and sin
// are multiplied by (arc.h: rope_dim, rope_factor).
struct RopeArgs { const float *inv_freq; int half; float factor; };

// What a layer's attention does besides attend: its RoPE, the scores' factor, its window (0: every
// position; else a query at p attends p - window + 1..p), and its sinks.
struct AttnSpec {
    RopeArgs rope;
    double scale;  // rounded to float once, with log2(e) where a kernel works in base 2
    int window;
    // gpt-oss's: query head h's sink logit s = sinks[h] (n_heads bf16 words, in the units of the
    // scaled scores x_j) joins its softmax's denominator alone: out = sum_j e^x_j v_j / (sum_j e^x_j
    // + e^s). The kernels add it where they normalize, their sums then taken against max(m, s) in
    // place of the scores' maximum m: no exponent is positive, so a sink far above the scores gives
    // an output that underflows to 0, never inf or NaN. Null: no sink, the plain softmax's bits.
    const uint16_t *sinks = nullptr;
    // A shared layer's (arc_model_config: kv_shared_layers): its rows are in the cache already, put
    // there by its source layer in the same forward; it stores none and reads no k or v from qkv,
    // whose rows hold q alone.
    bool cached = false;
};

// The cosine and sine of pair i at position pos, the factor applied, as the reference computes
// them: angle float(pos) * inv_freq[i] rounded once, sincos in float32, each times the factor.
// PLAIN: the factor is 1 (the multiplies, which would change nothing, are left out).
template <bool PLAIN = false>
__device__ __forceinline__ void rope_angles(const RopeArgs &r, int pos, int i, float *s, float *c) {
    sincosf(__fmul_rn((float)pos, r.inv_freq[i]), s, c);
    if (!PLAIN) { *s = __fmul_rn(*s, r.factor); *c = __fmul_rn(*c, r.factor); }
}

// Element d of a head row x (float32) under rotate-half RoPE of `half` pairs: d < half pairs with
// d + half, d < 2 half with d - half (angle i = d mod half, cosine c[i], sine s[i]), and an element
// past the rotated ones is x[d]. Explicit roundings (no fused multiply-add), as the reference
// computes it; the decode, the prefill and the verify rotate identically.
// PLAIN: every element is rotated (2 half is the row's length).
template <bool PLAIN = false>
__device__ __forceinline__ float rope_rotate_half(const float *x, int d, int half, const float *c, const float *s) {
    if (d < half) return __fsub_rn(__fmul_rn(x[d], c[d]), __fmul_rn(x[d + half], s[d]));
    if (!PLAIN && d >= 2 * half) return x[d];
    const int i = d - half;
    return __fadd_rn(__fmul_rn(x[d], c[i]), __fmul_rn(x[i], s[i]));
}

// The rows of one attention launch: the decode's one, or the verify's count of rows at positions
// pos[0..count), qkv rows `stride` floats apart, outputs (count, n_heads, head_dim), count times
// the scratch and count * n_heads zeroed tickets `done` of their own.
struct AttnRows {
    int count = 1, stride = 0;
    unsigned *done = nullptr;
};
// arc_op_attention and arc_op_prefill_attention as a layer runs them (AttnSpec): the forward, the
// verify (rows) and the prefill launch these; the entry points rotate every element at factor 1,
// scale the scores by 1 / sqrt(head_dim) and attend every position.
int attention_layer(arc_context *ctx, const float *qkv, const AttnSpec &spec, const KvCache &kv, int32_t n_heads,
                    int32_t n_kv_heads, int32_t head_dim, int32_t max_seq, const int32_t *pos, float *scratch,
                    float *out, const AttnRows &rows = AttnRows{});
int prefill_attention_layer(arc_context *ctx, const float *qkv, const AttnSpec &spec, const KvCache &kv,
                            int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t max_seq, int32_t n,
                            int32_t start, uint16_t *q_scratch, uint16_t *out, float *part, uint64_t part_n,
                            int32_t qkv_stride = 0);  // qkv's rows apart (0: q, k and v alone)
// Floats of partials the prefill's attention of n queries from start takes (0: none).
uint64_t prefill_attention_part_floats(int32_t n_heads, int32_t head_dim, int32_t n, int32_t start);

// The rows' k (rotated as `rope` says, rope_rotate_half) and v of qkv (rows, stride floats apart),
// in the cache's form, to cache row positions[i] of each kv head (verify_attention.cu); a row at
// a position outside [0, max_seq) stores nothing. The decode's one row (rows 1) takes any stride.
int launch_kv_store(arc_context *ctx, const float *qkv, int rows, int stride, const int32_t *positions,
                    const RopeArgs &rope, const KvCache &kv, int n_heads, int n_kv_heads, int hd, int max_seq);

// Heads of ATTN_TILE_MAX_HEAD_DIM < hd <= ATTN_MAX_HEAD_DIM elements, hd % 8 == 0, over a bf16 cache
// (attention_wide.cu): attention_layer's, its arguments checked there (the decode's row is stored
// to the cache first, the verify's rows are already), and prefill_attention_layer's after rope_kv
// (q (n, n_heads, hd) bf16, rotated; out (n, n_heads, hd) bf16).
int wide_decode_attention(arc_context *ctx, const float *qkv, const AttnSpec &spec, const KvCache &kv, int n_heads,
                          int n_kv_heads, int hd, int max_seq, const int32_t *pos, float *scratch, float *out,
                          const AttnRows &rows);
int wide_prefill_attention(arc_context *ctx, const uint16_t *q, const AttnSpec &spec, const uint16_t *k_cache,
                           const uint16_t *v_cache, int n_heads, int n_kv_heads, int hd, int max_seq, int n, int start,
                           uint16_t *out);

// The verify forward's attention (verify_attention.cu): k and v of qkv (rows, stride) to the cache
// at each row's position, then out (rows, n_heads, hd) float32, each row the decode's attention at
// its position; scratch: rows times arc_attention_scratch_bytes, done: rows * n_heads zeroed tickets.
int launch_verify_attention(arc_context *ctx, const float *qkv, int rows, int stride, const int32_t *positions,
                            const AttnSpec &spec, const KvCache &kv, int n_heads, int n_kv_heads,
                            int hd, int max_seq, float *scratch, unsigned *done, float *out);
