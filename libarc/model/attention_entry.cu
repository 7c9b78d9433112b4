// attention_entry.cu -- the decode's attention (attention.cu) as arc_ops.h's entry points: the
// AttnSpec a Llama layer has (every element rotated at factor 1, the scores scaled by
// 1 / sqrt(head_dim), every position attended), and the launcher the forwards call.
#include <math.h>

#include "model/attention_ops.cuh"

extern "C" int arc_op_attention(arc_context *ctx, const float *qkv, const float *inv_freq, uint16_t *k_cache,
                                uint16_t *v_cache, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                int32_t max_seq, const int32_t *pos, float *scratch, float *out) {
    const AttnSpec spec{RopeArgs{inv_freq, head_dim / 2, 1.0f}, 1.0 / sqrt((double)head_dim), 0};
    return attention_layer(ctx, qkv, spec, k_cache, v_cache, n_heads, n_kv_heads, head_dim, max_seq, pos, scratch,
                           out);
}

extern "C" int arc_op_attention_scratch_bytes(int32_t n_heads, int32_t head_dim, int32_t max_seq, uint64_t *bytes) {
    ARC_REQUIRE(bytes, "bytes is null");
    *bytes = 0;
    ARC_REQUIRE(n_heads > 0 && head_dim > 0 && max_seq > 0 && max_seq <= ATTN_MAX_SEQ,
                "shapes out of range: n_heads %d, head_dim %d, max_seq %d", n_heads, head_dim, max_seq);
    *bytes = arc_attention_scratch_bytes(n_heads, head_dim, max_seq);
    return ARC_OK;
}
