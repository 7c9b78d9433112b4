// attention_entry.cu -- the decode's and the verify's attention (attention.cu, verify_attention.cu)
// as arc_ops.h's entry points: each builds the AttnSpec a Llama layer has (every element rotated at
// factor 1, the scores scaled by 1 / sqrt(head_dim), every position attended), with gpt-oss's
// sinks where given, and calls the launcher the forwards call.
#include <math.h>

#include "model/attention_ops.cuh"

extern "C" int arc_op_attention(arc_context *ctx, const float *qkv, const float *inv_freq, uint16_t *k_cache,
                                uint16_t *v_cache, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                int32_t max_seq, const int32_t *pos, float *scratch, float *out) {
    const AttnSpec spec{RopeArgs{inv_freq, head_dim / 2, 1.0f}, 1.0 / sqrt((double)head_dim), 0};
    return attention_layer(ctx, qkv, spec, KvCache{k_cache, v_cache}, n_heads, n_kv_heads, head_dim, max_seq, pos,
                           scratch, out);
}

extern "C" int arc_op_attention_scratch_bytes(int32_t n_heads, int32_t head_dim, int32_t max_seq, uint64_t *bytes) {
    ARC_REQUIRE(bytes, "bytes is null");
    *bytes = 0;
    ARC_REQUIRE(n_heads > 0 && head_dim > 0 && max_seq > 0 && max_seq <= ATTN_MAX_SEQ,
                "shapes out of range: n_heads %d, head_dim %d, max_seq %d", n_heads, head_dim, max_seq);
    *bytes = arc_attention_scratch_bytes(n_heads, head_dim, max_seq);
    return ARC_OK;
}

extern "C" int arc_op_attention_sinks(arc_context *ctx, const float *qkv, int32_t rows, const int32_t *positions,
                                      const float *inv_freq, uint16_t *k_cache, uint16_t *v_cache, int32_t n_heads,
                                      int32_t n_kv_heads, int32_t head_dim, int32_t max_seq, const uint16_t *sinks,
                                      float *scratch, uint32_t *done, float *out) {
    const AttnSpec spec{RopeArgs{inv_freq, head_dim / 2, 1.0f}, 1.0 / sqrt((double)head_dim), 0, sinks};
    ARC_REQUIRE(rows >= 1 && rows <= 8, "rows must be in 1..8, got %d", rows);
    if (rows == 1)
        return attention_layer(ctx, qkv, spec, KvCache{k_cache, v_cache}, n_heads, n_kv_heads, head_dim, max_seq,
                               positions, scratch, out);
    // The verify stores the rows' k and v before attention_layer checks its arguments: what the
    // store reads and where it writes are checked here first.
    ARC_REQUIRE(ctx, "ctx is null");
    ARC_REQUIRE(qkv && positions && inv_freq && k_cache && v_cache && scratch && done && out,
                "null pointer (qkv, positions, inv_freq, k_cache, v_cache, scratch, done and out are required)");
    ARC_REQUIRE(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                "n_heads (%d) must be a positive multiple of n_kv_heads (%d)", n_heads, n_kv_heads);
    ARC_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && head_dim <= ATTN_MAX_HEAD_DIM && (head_dim <= 128 || head_dim % 8 == 0),
                "head_dim must be even and in [2, %d] (a multiple of 8 past 128), got %d", ATTN_MAX_HEAD_DIM, head_dim);
    ARC_REQUIRE(max_seq > 0 && max_seq <= ATTN_MAX_SEQ, "max_seq must be in [1, %d], got %d", ATTN_MAX_SEQ, max_seq);
    return launch_verify_attention(ctx, qkv, rows, (n_heads + 2 * n_kv_heads) * head_dim, positions, spec,
                                   KvCache{k_cache, v_cache}, n_heads, n_kv_heads, head_dim, max_seq, scratch, done, out);
}
