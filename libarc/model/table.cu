// table.cu -- the tensor table, the one libarc lays the weights out by (model.cu) and arcpy names
// and checks them by (arc_tensor_shape): each arc_tensor's name, shape, and whether it is per layer
// and a matrix (what a quantized format may hold).
#include "model/deltanet.cuh"
#include "model/forward/layer.cuh"

static const char *const TENSOR_NAMES[ARC_TENSOR_COUNT] = {
    "ARC_TENSOR_EMBED",  "ARC_TENSOR_ATTN_NORM", "ARC_TENSOR_WQ",         "ARC_TENSOR_WK",
    "ARC_TENSOR_WV",     "ARC_TENSOR_BQ",        "ARC_TENSOR_BK",         "ARC_TENSOR_BV",
    "ARC_TENSOR_WO",     "ARC_TENSOR_MLP_NORM",  "ARC_TENSOR_W_GATE",     "ARC_TENSOR_W_UP",
    "ARC_TENSOR_W_DOWN", "ARC_TENSOR_FINAL_NORM", "ARC_TENSOR_LM_HEAD",   "ARC_TENSOR_ROPE_INV_FREQ",
    "ARC_TENSOR_Q_NORM", "ARC_TENSOR_K_NORM", "ARC_TENSOR_POST_ATTN_NORM", "ARC_TENSOR_POST_FFN_NORM",
    "ARC_TENSOR_MOE_ROUTER", "ARC_TENSOR_MOE_GATE", "ARC_TENSOR_MOE_UP", "ARC_TENSOR_MOE_DOWN",
    "ARC_TENSOR_SHARED_GATE", "ARC_TENSOR_SHARED_UP", "ARC_TENSOR_SHARED_DOWN", "ARC_TENSOR_SHARED_ROUTER",
    "ARC_TENSOR_WQ_GATE", "ARC_TENSOR_DN_QKV", "ARC_TENSOR_DN_Z", "ARC_TENSOR_DN_B", "ARC_TENSOR_DN_A",
    "ARC_TENSOR_DN_CONV", "ARC_TENSOR_DN_A_LOG", "ARC_TENSOR_DN_DT_BIAS", "ARC_TENSOR_DN_NORM", "ARC_TENSOR_DN_OUT",
    "ARC_TENSOR_SINKS", "ARC_TENSOR_BO", "ARC_TENSOR_MOE_ROUTER_BIAS", "ARC_TENSOR_MOE_GATE_BIAS",
    "ARC_TENSOR_MOE_UP_BIAS", "ARC_TENSOR_MOE_DOWN_BIAS", "ARC_TENSOR_LAYER_SCALAR", "ARC_TENSOR_MOE_NORM",
    "ARC_TENSOR_FFN_OUT_NORM", "ARC_TENSOR_MOE_OUT_NORM", "ARC_TENSOR_ROUTER_SCALE", "ARC_TENSOR_EXPERT_SCALE",
    "ARC_TENSOR_PLE_EMBED", "ARC_TENSOR_PLE_PROJECTION", "ARC_TENSOR_PLE_NORM", "ARC_TENSOR_PLE_GATE",
    "ARC_TENSOR_PLE_OUT", "ARC_TENSOR_PLE_POST_NORM",
};

bool tensor_per_layer(int t) {
    return t != ARC_TENSOR_EMBED && t != ARC_TENSOR_FINAL_NORM && t != ARC_TENSOR_LM_HEAD && t != ARC_TENSOR_PLE_EMBED &&
           t != ARC_TENSOR_PLE_PROJECTION && t != ARC_TENSOR_PLE_NORM;
}
const char *tensor_name(int t) { return TENSOR_NAMES[t]; }

// The tensor table, the one libarc and arcpy both read (arc_tensor_shape): the rows and columns of
// tensor t of layer `layer` under config c (a vector: rows 1; the RoPE frequencies: float32), rows 0
// where c has no such tensor there. Layers differ by their FFN (a GLU, a mixture of experts, or both) and
// by their attention's dims (layer_dims: Gemma 4's global layers).
void table_shape(const arc_model_config &c, int t, int layer, uint64_t *rows, uint64_t *cols) {
    if ((t >= ARC_TENSOR_MOE_ROUTER && t <= ARC_TENSOR_SHARED_ROUTER) ||
        (t >= ARC_TENSOR_MOE_ROUTER_BIAS && t <= ARC_TENSOR_MOE_DOWN_BIAS) ||
        (t >= ARC_TENSOR_MOE_NORM && t <= ARC_TENSOR_EXPERT_SCALE))
        return moe_table_shape(c, t, layer, rows, cols);
    if (t >= ARC_TENSOR_DN_QKV && t <= ARC_TENSOR_DN_OUT) return dn_table_shape(c, t, layer, rows, cols);
    const uint64_t dim = c.dim, vocab = c.vocab, ple = c.ple_dim, layers = c.n_layers;
    const bool per_layer = tensor_per_layer(t);
    const uint64_t ffn = (uint64_t)layer_ffn(c, per_layer ? layer : 0);
    const bool shared = per_layer && layer_shared(c, layer);  // no k or v of its own
    // A MoE layer has no dense FFN, but where its experts run beside one (Gemma 4)
    const bool moe = tensor_per_layer(t) && layer_moe(c, layer) && !c.experts_beside;
    const AttnDims ad = layer_dims(c, tensor_per_layer(t) ? layer : 0);
    const uint64_t q = (uint64_t)ad.q_dim, kv = (uint64_t)ad.kv_dim;
    uint64_t r = 1, k = dim;
    bool present = true;
    switch (t) {
    case ARC_TENSOR_EMBED: r = vocab; break;
    case ARC_TENSOR_LM_HEAD: r = vocab; present = !c.tied_embeddings; break;
    case ARC_TENSOR_WQ: r = q; break;
    case ARC_TENSOR_WQ_GATE: r = q; present = c.attn_gate; break;
    case ARC_TENSOR_WK: case ARC_TENSOR_WV: r = kv; present = !shared; break;
    case ARC_TENSOR_BQ: k = q; present = c.qkv_bias; break;
    case ARC_TENSOR_BK: case ARC_TENSOR_BV: k = kv; present = c.qkv_bias && !shared; break;
    case ARC_TENSOR_WO: r = dim; k = q; break;
    case ARC_TENSOR_W_GATE: case ARC_TENSOR_W_UP: r = ffn; present = !moe; break;
    case ARC_TENSOR_W_DOWN: r = dim; k = ffn; present = !moe; break;
    case ARC_TENSOR_ROPE_INV_FREQ: k = (uint64_t)(c.rope_dim ? c.rope_dim : ad.hd) / 2; break;
    case ARC_TENSOR_Q_NORM: k = ad.hd; present = c.qk_norm; break;
    case ARC_TENSOR_K_NORM: k = ad.hd; present = c.qk_norm && !shared; break;
    case ARC_TENSOR_POST_ATTN_NORM: case ARC_TENSOR_POST_FFN_NORM: present = c.post_norms; break;
    case ARC_TENSOR_SINKS: k = c.n_heads; present = c.attn_sinks; break;
    case ARC_TENSOR_BO: present = c.o_bias; break;
    case ARC_TENSOR_LAYER_SCALAR: k = 1; present = c.layer_scalar; break;
    // Gemma 4's per-layer embeddings: a table, a projection and its norm; each layer's gate, out and norm
    case ARC_TENSOR_PLE_EMBED: r = c.ple_vocab; k = layers * ple; present = ple > 0; break;
    case ARC_TENSOR_PLE_PROJECTION: r = layers * ple; present = ple > 0; break;
    case ARC_TENSOR_PLE_NORM: k = ple; present = ple > 0; break;
    case ARC_TENSOR_PLE_GATE: r = ple; present = ple > 0; break;
    case ARC_TENSOR_PLE_OUT: r = dim; k = ple; present = ple > 0; break;
    case ARC_TENSOR_PLE_POST_NORM: present = ple > 0; break;
    default: break;  // ATTN_NORM, MLP_NORM, FINAL_NORM: (dim)
    }
    *rows = present ? r : 0;
    *cols = k;
    if (tensor_per_layer(t)) dn_table_shape(c, t, layer, rows, cols);  // a DeltaNet layer has no attention
}

bool tensor_is_matrix(int t) {
    switch (t) {
    case ARC_TENSOR_WQ: case ARC_TENSOR_WK: case ARC_TENSOR_WV: case ARC_TENSOR_WO: case ARC_TENSOR_W_GATE:
    case ARC_TENSOR_W_UP: case ARC_TENSOR_W_DOWN: case ARC_TENSOR_LM_HEAD: case ARC_TENSOR_MOE_GATE:
    case ARC_TENSOR_MOE_UP: case ARC_TENSOR_MOE_DOWN: case ARC_TENSOR_SHARED_GATE: case ARC_TENSOR_SHARED_UP:
    case ARC_TENSOR_SHARED_DOWN: case ARC_TENSOR_WQ_GATE: case ARC_TENSOR_DN_QKV: case ARC_TENSOR_DN_Z:
    case ARC_TENSOR_DN_B: case ARC_TENSOR_DN_A: case ARC_TENSOR_DN_OUT: return true;
    default: return false;
    }
}
