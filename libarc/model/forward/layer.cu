// layer.cu -- the layer program (arc.h: arc_layer_op): the ops of a layer, and the data that
// differ from layer to layer (the window, the attention's dims, the FFN's kind: a GLU or a mixture
// of experts, and the experts' tensors). layer.cuh's run_layers walks it for every forward; the NumPy reference reads
// it through arc_layer_program, and the tensor table through arc_tensor_shape.
#include "layer.cuh"

#include "model/deltanet.cuh"

int layer_program(const arc_model_config &c, int layer, int32_t *ops) {
    int n = 0;
    if (layer_dn(c, layer)) {  // a gated DeltaNet layer in place of the attention (deltanet.cuh)
        ops[n++] = ARC_OP_DN_IN;
        ops[n++] = ARC_OP_DN_STEP;
        ops[n++] = ARC_OP_DN_OUT;
    } else {
        ops[n++] = ARC_OP_ATTN_IN;
        if (c.qk_norm) ops[n++] = ARC_OP_QK_NORM;
        ops[n++] = ARC_OP_ATTEND;
        if (c.attn_gate) ops[n++] = ARC_OP_ATTN_GATE;
        ops[n++] = c.post_norms ? ARC_OP_ATTN_OUT_NORM : ARC_OP_ATTN_OUT;
    }
    // the layers differ by their FFN: a mixture of experts, one GLU, or both (the experts beside it)
    if (layer_moe(c, layer) && !c.experts_beside) {
        ops[n++] = ARC_OP_MOE_IN;
        ops[n++] = ARC_OP_MOE_OUT;
        return n;
    }
    ops[n++] = ARC_OP_FFN_IN;
    if (layer_moe(c, layer))
        ops[n++] = ARC_OP_EXPERTS_BESIDE;
    else
        ops[n++] = c.post_norms ? ARC_OP_FFN_OUT_NORM : ARC_OP_FFN_OUT;
    if (c.ple_dim) ops[n++] = ARC_OP_PER_LAYER_INPUT;
    if (c.layer_scalar) ops[n++] = ARC_OP_LAYER_SCALAR;
    return n;
}

bool layer_global(const arc_model_config &c, int layer) { return layer_window(c, layer) == 0; }

int layer_kv_source(const arc_model_config &c, int layer) {
    const int first = c.n_layers - c.kv_shared_layers;
    if (layer < first) return layer;
    for (int i = first - 1; i >= 0; --i)
        if (layer_global(c, i) == layer_global(c, layer)) return i;
    return -1;
}

bool layer_shared(const arc_model_config &c, int layer) { return layer_kv_source(c, layer) != layer; }

int32_t layer_ffn(const arc_model_config &c, int layer) {
    return c.double_wide_ffn && layer_shared(c, layer) ? 2 * c.ffn_dim : c.ffn_dim;
}

static AttnDims dims_of(const arc_model_config &c, int32_t hd, int32_t n_kv) {
    const int32_t q = c.n_heads * hd, kv = n_kv * hd;
    return AttnDims{hd, n_kv, q, kv, q + 2 * kv + (c.attn_gate ? q : 0)};
}

AttnDims layer_dims(const arc_model_config &c, int layer) {
    AttnDims d = !layer_global(c, layer)
                     ? dims_of(c, c.head_dim, c.n_kv_heads)
                     : dims_of(c, c.global_head_dim > 0 ? c.global_head_dim : c.head_dim,
                               c.global_n_kv_heads > 0 ? c.global_n_kv_heads : c.n_kv_heads);
    if (layer_shared(c, layer)) d.qkv_rows = d.q_dim + (c.attn_gate ? d.q_dim : 0);  // q alone: no k or v rows
    return d;
}

AttnDims max_layer_dims(const arc_model_config &c) {
    AttnDims m = dims_of(c, c.head_dim, c.n_kv_heads);
    for (int l = 0; l < c.n_layers; ++l) {
        const AttnDims d = layer_dims(c, l);
        m.hd = d.hd > m.hd ? d.hd : m.hd;
        m.n_kv = d.n_kv > m.n_kv ? d.n_kv : m.n_kv;
        m.q_dim = d.q_dim > m.q_dim ? d.q_dim : m.q_dim;
        m.kv_dim = d.kv_dim > m.kv_dim ? d.kv_dim : m.kv_dim;
        m.qkv_rows = d.qkv_rows > m.qkv_rows ? d.qkv_rows : m.qkv_rows;
    }
    return m;
}

int check_gemma4_fields(const arc_model_config &c, const char *who) {
    ARC_REQUIRE_AS(who, c.global_head_dim >= 0 && c.global_n_kv_heads >= 0,
                   "config.global_head_dim and global_n_kv_heads must not be negative, got %d and %d",
                   c.global_head_dim, c.global_n_kv_heads);
    ARC_REQUIRE_AS(who, (c.v_norm == 0 || c.v_norm == 1) && (c.layer_scalar == 0 || c.layer_scalar == 1),
                   "config.v_norm and layer_scalar must be 0 or 1, got %d and %d", c.v_norm, c.layer_scalar);
    ARC_REQUIRE_AS(who, c.final_softcap >= 0.0f && c.final_softcap < 3.4e38f,
                   "config.final_softcap must be a finite number >= 0, got %g", (double)c.final_softcap);
    const int32_t gh = c.global_head_dim > 0 ? c.global_head_dim : c.head_dim;
    const int32_t least = gh < c.head_dim ? gh : c.head_dim;
    ARC_REQUIRE_AS(who, gh % 2 == 0 && c.rope_dim <= least,
                   "config.global_head_dim must be even and rope_dim (%d) at most every layer's head_dim, got %d",
                   c.rope_dim, gh);
    const int32_t gkv = c.global_n_kv_heads > 0 ? c.global_n_kv_heads : c.n_kv_heads;
    ARC_REQUIRE_AS(who, c.n_heads % gkv == 0, "config.n_heads (%d) must be a multiple of global_n_kv_heads (%d)",
                   c.n_heads, gkv);
    ARC_REQUIRE_AS(who, c.ple_dim >= 0 && c.ple_vocab >= 0 && (c.ple_dim == 0) == (c.ple_vocab == 0),
                   "config.ple_dim and ple_vocab must be both positive or both 0, got %d and %d", c.ple_dim,
                   c.ple_vocab);
    ARC_REQUIRE_AS(who, c.kv_shared_layers >= 0 && c.kv_shared_layers < c.n_layers,
                   "config.kv_shared_layers must be in [0, n_layers %d), got %d", c.n_layers, c.kv_shared_layers);
    for (int l = c.n_layers - c.kv_shared_layers; l < c.n_layers; ++l)
        ARC_REQUIRE_AS(who, layer_kv_source(c, l) >= 0,
                       "config: shared layer %d has no earlier layer of its kind to read the K/V of", l);
    ARC_REQUIRE_AS(who, c.double_wide_ffn == 0 || (c.double_wide_ffn == 1 && c.kv_shared_layers > 0),
                   "config.double_wide_ffn must be 0, or 1 with kv_shared_layers, got %d", c.double_wide_ffn);
    return ARC_OK;
}

bool layer_moe(const arc_model_config &c, int layer) {
    if (c.n_experts <= 0) return false;
    const int every = c.moe_every > 0 ? c.moe_every : 1;
    if ((layer + 1) % every != 0) return false;
    return !(layer < 128 && ((c.dense_layers[layer / 32] >> (layer % 32)) & 1u));
}

void moe_table_shape(const arc_model_config &c, int t, int layer, uint64_t *rows, uint64_t *cols) {
    const uint64_t dim = c.dim, experts = c.n_experts, ffn = c.expert_ffn_dim, shared = c.shared_ffn_dim;
    const bool moe = layer_moe(c, layer);
    uint64_t r = 0, k = dim;
    switch (t) {
    case ARC_TENSOR_MOE_ROUTER: r = experts; break;
    case ARC_TENSOR_MOE_GATE: case ARC_TENSOR_MOE_UP: r = experts * ffn; break;
    case ARC_TENSOR_MOE_DOWN: r = experts * dim; k = ffn; break;
    case ARC_TENSOR_SHARED_GATE: case ARC_TENSOR_SHARED_UP: r = shared; break;
    case ARC_TENSOR_SHARED_DOWN: r = shared ? dim : 0; k = shared; break;
    case ARC_TENSOR_SHARED_ROUTER: r = shared ? 1 : 0; break;
    // gpt-oss's biases: vectors (rows 1) with expert_bias
    case ARC_TENSOR_MOE_ROUTER_BIAS: r = c.expert_bias ? 1 : 0; k = experts; break;
    case ARC_TENSOR_MOE_GATE_BIAS: case ARC_TENSOR_MOE_UP_BIAS: r = c.expert_bias ? 1 : 0; k = experts * ffn; break;
    case ARC_TENSOR_MOE_DOWN_BIAS: r = c.expert_bias ? 1 : 0; k = experts * dim; break;
    // Gemma 4's experts beside the dense FFN: vectors (rows 1) with experts_beside
    case ARC_TENSOR_MOE_NORM: case ARC_TENSOR_FFN_OUT_NORM: case ARC_TENSOR_MOE_OUT_NORM: case ARC_TENSOR_ROUTER_SCALE:
        r = c.experts_beside ? 1 : 0; break;
    case ARC_TENSOR_EXPERT_SCALE: r = c.experts_beside ? 1 : 0; k = experts; break;
    default: break;
    }
    *rows = moe ? r : 0;
    *cols = k;
}

int check_moe(const arc_model_config &c, const char *who) {
    ARC_REQUIRE_AS(who, c.n_experts >= 0, "config.n_experts must not be negative, got %d", c.n_experts);
    ARC_REQUIRE_AS(who, c.experts_beside == 0 || c.experts_beside == 1, "config.experts_beside must be 0 or 1, got %d",
                   c.experts_beside);
    if (c.n_experts == 0) return ARC_OK;
    ARC_REQUIRE_AS(who, c.n_experts_used >= 1 && c.n_experts_used <= c.n_experts,
                   "config.n_experts_used must be in [1, n_experts %d], got %d", c.n_experts, c.n_experts_used);
    ARC_REQUIRE_AS(who, c.expert_ffn_dim > 0, "config.expert_ffn_dim must be positive, got %d", c.expert_ffn_dim);
    ARC_REQUIRE_AS(who, c.routing == ARC_ROUTE_SOFTMAX_TOPK || c.routing == ARC_ROUTE_TOPK_SOFTMAX,
                   "config.routing must be an arc_routing (0 or 1), got %d", c.routing);
    ARC_REQUIRE_AS(who, c.norm_topk == 0 || c.norm_topk == 1, "config.norm_topk must be 0 or 1, got %d", c.norm_topk);
    ARC_REQUIRE_AS(who, c.shared_ffn_dim >= 0 && c.moe_every >= 0,
                   "config.shared_ffn_dim and moe_every must not be negative, got %d and %d", c.shared_ffn_dim,
                   c.moe_every);
    ARC_REQUIRE_AS(who, !c.post_norms || c.experts_beside,
                   "config: post_norms and mixture-of-experts layers do not combine");
    ARC_REQUIRE_AS(who,
                   !c.experts_beside || (c.post_norms && c.routing == ARC_ROUTE_SOFTMAX_TOPK && c.norm_topk &&
                                         c.shared_ffn_dim == 0 && !c.expert_bias),
                   "config: experts_beside takes post_norms, SOFTMAX_TOPK routing with norm_topk, no shared expert and "
                   "no expert_bias");
    ARC_REQUIRE_AS(who, c.expert_bias == 0 || c.expert_bias == 1, "config.expert_bias must be 0 or 1, got %d",
                   c.expert_bias);
    ARC_REQUIRE_AS(who, !(c.expert_bias && c.shared_ffn_dim), "config: expert_bias and a shared expert do not combine");
    return ARC_OK;
}

int layer_window(const arc_model_config &c, int layer) {
    if (c.sliding_window <= 0) return 0;
    const bool global = c.window_pattern > 0 && layer % c.window_pattern == c.window_pattern - 1;
    return global ? 0 : c.sliding_window;
}

extern "C" int arc_layer_program(const arc_model_config *config, int32_t layer, int32_t *ops, int32_t *count) {
    ARC_REQUIRE(config && ops && count, "null argument");
    // Only what the program reads is checked: a shape the kernels cannot run still has a program.
    ARC_REQUIRE(config->qk_norm == 0 || config->qk_norm == 1, "config.qk_norm must be 0 or 1, got %d", config->qk_norm);
    ARC_REQUIRE(config->post_norms == 0 || config->post_norms == 1, "config.post_norms must be 0 or 1, got %d",
                config->post_norms);
    ARC_REQUIRE(layer >= 0 && layer < config->n_layers, "layer must be in [0, %d), got %d", config->n_layers, layer);
    int st = check_moe(*config, __func__);
    if (st == ARC_OK) st = check_dn(*config, __func__);
    if (st == ARC_OK) st = check_gemma4_fields(*config, __func__);
    if (st != ARC_OK) return st;
    *count = layer_program(*config, layer, ops);
    return ARC_OK;
}

// The tensor table's entry point (model.cu's table_shape).
extern "C" int arc_tensor_shape(const arc_model_config *config, int32_t tensor, int32_t layer, int64_t *rows,
                                int64_t *cols) {
    ARC_REQUIRE(config && rows && cols, "null argument");
    ARC_REQUIRE(tensor >= 0 && tensor < ARC_TENSOR_COUNT, "unknown tensor id %d (valid: 0..%d)", tensor,
                ARC_TENSOR_COUNT - 1);
    // Only what the table reads is checked: a shape the kernels cannot run still has a table.
    const arc_model_config &c = *config;
    ARC_REQUIRE(c.dim > 0 && c.n_layers > 0 && c.n_heads > 0 && c.n_kv_heads > 0 && c.head_dim > 0 &&
                    c.ffn_dim > 0 && c.vocab > 0,
                "config: dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim and vocab must be positive");
    ARC_REQUIRE(c.rope_dim >= 0 && c.rope_dim % 2 == 0 && c.rope_dim <= c.head_dim,
                "config.rope_dim must be even and in [0, head_dim %d] (0: head_dim), got %d", c.head_dim, c.rope_dim);
    if (const int st = check_moe(c, __func__)) return st;
    if (const int st = check_dn(c, __func__)) return st;
    if (const int st = check_gemma4_fields(c, __func__)) return st;
    if (tensor_per_layer(tensor))
        ARC_REQUIRE(layer >= 0 && layer < c.n_layers, "%s is a per-layer tensor: layer must be in [0, %d), got %d",
                    tensor_name(tensor), c.n_layers, layer);
    else
        ARC_REQUIRE(layer == 0, "%s is a global tensor: layer must be 0, got %d", tensor_name(tensor), layer);
    uint64_t r, k;
    table_shape(c, tensor, layer, &r, &k);
    *rows = (int64_t)r;
    *cols = (int64_t)k;
    return ARC_OK;
}
