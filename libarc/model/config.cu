// config.cu -- arc_model_create's checks of an arc_model_config: the shapes and flags libarc's
// kernels take (the table and the layer program check only what they read: layer.cu).
#include <math.h>

#include "model/attention_ops.cuh"
#include "model/deltanet.cuh"
#include "model/forward/layer.cuh"
#include "model/gemv/gemv.cuh"
#include "model/moe/moe.cuh"

int check_config(const arc_model_config *c) {
    ARC_REQUIRE(c->dim > 0 && c->dim % 8 == 0 && c->dim <= GEMV_MAX_COLS,
                "config.dim must be a multiple of 8 in [8, %d], got %d", GEMV_MAX_COLS, c->dim);
    ARC_REQUIRE(c->n_layers > 0, "config.n_layers must be positive, got %d", c->n_layers);
    ARC_REQUIRE(c->n_heads > 0, "config.n_heads must be positive, got %d", c->n_heads);
    ARC_REQUIRE(c->n_kv_heads > 0, "config.n_kv_heads must be positive, got %d", c->n_kv_heads);
    ARC_REQUIRE(c->n_heads % c->n_kv_heads == 0, "config.n_heads (%d) must be a multiple of n_kv_heads (%d)",
                c->n_heads, c->n_kv_heads);
    ARC_REQUIRE(c->head_dim > 0 && c->head_dim % 2 == 0 && c->head_dim <= ATTN_MAX_HEAD_DIM &&
                    (c->head_dim <= 128 || c->head_dim % 8 == 0),
                "config.head_dim must be even and in [2, %d] (a multiple of 8 past 128), got %d", ATTN_MAX_HEAD_DIM,
                c->head_dim);
    const long long q_dim = (long long)c->n_heads * c->head_dim;
    ARC_REQUIRE(q_dim % 8 == 0 && q_dim <= GEMV_MAX_COLS,
                "config.n_heads * head_dim must be a multiple of 8 and at most %d, got %lld", GEMV_MAX_COLS, q_dim);
    ARC_REQUIRE(c->ffn_dim > 0 && c->ffn_dim % 8 == 0 && c->ffn_dim <= GEMV_MAX_COLS,
                "config.ffn_dim must be a multiple of 8 in [8, %d], got %d", GEMV_MAX_COLS, c->ffn_dim);
    ARC_REQUIRE(c->vocab > 0, "config.vocab must be positive, got %d", c->vocab);
    ARC_REQUIRE(c->max_seq > 0 && c->max_seq <= ATTN_MAX_SEQ, "config.max_seq must be in [1, %d], got %d",
                ATTN_MAX_SEQ, c->max_seq);
    ARC_REQUIRE(c->rms_eps > 0.0f && isfinite(c->rms_eps), "config.rms_eps must be positive and finite, got %g",
                (double)c->rms_eps);
    ARC_REQUIRE(c->tied_embeddings == 0 || c->tied_embeddings == 1,
                "config.tied_embeddings must be 0 or 1, got %d", c->tied_embeddings);
    ARC_REQUIRE(c->qkv_bias == 0 || c->qkv_bias == 1, "config.qkv_bias must be 0 or 1, got %d", c->qkv_bias);
    ARC_REQUIRE(c->qk_norm == 0 || c->qk_norm == 1, "config.qk_norm must be 0 or 1, got %d", c->qk_norm);
    ARC_REQUIRE(c->rope_dim >= 0 && c->rope_dim % 2 == 0 && c->rope_dim <= c->head_dim,
                "config.rope_dim must be even and in [0, head_dim %d] (0: head_dim), got %d", c->head_dim, c->rope_dim);
    ARC_REQUIRE(c->rope_factor >= 0.0f && isfinite(c->rope_factor),
                "config.rope_factor must be finite and not negative (0: 1), got %g", (double)c->rope_factor);
    ARC_REQUIRE(c->post_norms == 0 || c->post_norms == 1, "config.post_norms must be 0 or 1, got %d", c->post_norms);
    ARC_REQUIRE(c->norm_plus_one == 0 || c->norm_plus_one == 1, "config.norm_plus_one must be 0 or 1, got %d",
                c->norm_plus_one);
    ARC_REQUIRE(c->activation >= ARC_ACT_SILU && c->activation <= ARC_ACT_SWIGLU_LIMIT,
                "config.activation must be an arc_activation (0 to 2), got %d", c->activation);
    ARC_REQUIRE((c->attn_sinks == 0 || c->attn_sinks == 1) && (c->o_bias == 0 || c->o_bias == 1),
                "config.attn_sinks and o_bias must be 0 or 1, got %d and %d", c->attn_sinks, c->o_bias);
    ARC_REQUIRE(c->embed_scale >= 0.0f && isfinite(c->embed_scale) && c->attn_scale >= 0.0f && isfinite(c->attn_scale),
                "config.embed_scale and attn_scale must be finite and not negative (0: default), got %g and %g",
                (double)c->embed_scale, (double)c->attn_scale);
    ARC_REQUIRE(c->sliding_window >= 0 && c->window_pattern >= 0,
                "config.sliding_window and window_pattern must not be negative, got %d and %d", c->sliding_window,
                c->window_pattern);
    ARC_REQUIRE(!(c->attn_gate && c->qkv_bias), "config: attn_gate and qkv_bias do not combine");
    ARC_REQUIRE(c->kv_cache == ARC_KV_BF16 || c->kv_cache == ARC_KV_Q8_0,
                "config.kv_cache must be an arc_kv_form (0 bf16, 1 q8_0), got %d", c->kv_cache);
    ARC_REQUIRE(c->kv_cache != ARC_KV_Q8_0 || c->head_dim % 32 == 0,
                "a q8_0 KV cache holds whole blocks of 32: head_dim must be a multiple of 32, got %d", c->head_dim);
    if (const int st = check_gemma4_fields(*c, "arc_model_create")) return st;
    ARC_REQUIRE(!c->v_norm || c->qk_norm, "config: v_norm needs qk_norm (QK_NORM norms v)");
    ARC_REQUIRE(c->ple_dim % 8 == 0 && c->ple_dim <= GEMV_MAX_COLS,
                "config.ple_dim must be a multiple of 8 up to %d, got %d", GEMV_MAX_COLS, c->ple_dim);
    ARC_REQUIRE(!(c->kv_shared_layers && c->attn_gate), "config: kv_shared_layers and attn_gate do not combine");
    ARC_REQUIRE(!c->double_wide_ffn || 2 * c->ffn_dim <= GEMV_MAX_COLS,
                "config: double_wide_ffn takes 2 ffn_dim up to %d, got %d", GEMV_MAX_COLS, 2 * c->ffn_dim);
    for (int l = 0; l < c->n_layers; ++l) {  // Gemma 4's global layers: their own heads
        const AttnDims d = layer_dims(*c, l);
        if (d.hd == c->head_dim && d.n_kv == c->n_kv_heads) continue;
        ARC_REQUIRE(d.hd <= ATTN_MAX_HEAD_DIM && (d.hd <= 128 || d.hd % 8 == 0) && d.q_dim % 8 == 0 &&
                        d.q_dim <= GEMV_MAX_COLS,
                    "config.global_head_dim must be even, at most %d (a multiple of 8 past 128), and n_heads times "
                    "it a multiple of 8 and at most %d, got %d", ATTN_MAX_HEAD_DIM, GEMV_MAX_COLS, d.hd);
        break;
    }
    const AttnDims most = max_layer_dims(*c);
    ARC_REQUIRE(c->kv_cache != ARC_KV_Q8_0 || most.hd <= ATTN_TILE_MAX_HEAD_DIM,
                "a q8_0 KV cache takes heads of at most %d (wider ones a bf16 cache), got head_dim %d",
                ATTN_TILE_MAX_HEAD_DIM, most.hd);
    if (const int st = check_dn(*c, "arc_model_create")) return st;
    if (dn_layer_count(*c)) {
        ARC_REQUIRE(c->dn_head_dim == DN_HEAD_DIM, "config.dn_head_dim must be %d, got %d", DN_HEAD_DIM,
                    c->dn_head_dim);
        ARC_REQUIRE(c->dn_conv_kernel <= DN_MAX_KERNEL, "config.dn_conv_kernel must be at most %d, got %d",
                    DN_MAX_KERNEL, c->dn_conv_kernel);
        const long long v_dim = (long long)c->dn_v_heads * c->dn_head_dim;
        ARC_REQUIRE(v_dim <= GEMV_MAX_COLS, "config: dn_v_heads * dn_head_dim must be at most %d, got %lld",
                    GEMV_MAX_COLS, v_dim);
    }
    if (const int st = check_moe(*c, "arc_model_create")) return st;
    return check_moe_limits(*c, "arc_model_create");
}
