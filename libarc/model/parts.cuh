// parts.cuh -- what the forwards (the decode step, the prefill, the speculative verify) read of
// a model (model.cu): its weights as Weights, a layer's parts, and the model's activations.
#pragma once

#include "internal.cuh"
#include "model/attention_ops.cuh"

// The prefill's and the speculative step's buffers (buffers.cuh).
struct PrefillBuffers;
struct SpecBuffers;

// A weight matrix as the forward reads it: its data and its arc_format (bf16 or quantized).
struct Weight {
    const void *p;
    int32_t format;
};

// One layer's weights and KV cache, each (n_kv_heads, max_seq, head_dim). Wq Wk Wv lie one after
// the other (so do bq bk bv, and Wgate Wup: one matrix, of one format), so that consecutive
// parts of one format are read as one matrix from the first.
// The sizes of a model's gated DeltaNet layers (deltanet.cuh; all 0 without them) and of the
// buffers its layers share: DN_IN's output rows and the attention's or the DeltaNet's output.
struct DeltaNetDims {
    int32_t k_dim, v_dim, conv_dim;  // dn_k_heads * head_dim, dn_v_heads * head_dim, 2 k_dim + v_dim
    int32_t rows;                    // DN_IN's output: conv_dim + v_dim + 2 dn_v_heads
    int32_t att_dim;                 // an output row, either kind: max(q_dim, v_dim)
    int32_t qkv_alloc;               // an input row, either kind: max(qkv_rows, rows)
    uint64_t slot_floats;            // one state slot: conv_dim (kernel - 1) + dn_v_heads head_dim^2
    int32_t scratch_row;             // a row of the prefill's scratch: conv_dim + 2 dn_v_heads, rounded up to 4
};

// A layer's attention dims (arc_model_config: Gemma 4's global layers take their own): heads of hd
// elements, n_kv kv heads, and the rows of q, of k (or v) and of ATTN_IN's output (q, k, v and,
// with attn_gate, the gate).
struct AttnDims {
    int32_t hd, n_kv, q_dim, kv_dim, qkv_rows;
};

struct LayerParts {
    AttnDims dims;                    // the attention's (a DeltaNet layer: the config's)
    int32_t layer;                    // its index
    int32_t ffn;                      // the dense FFN's width (layer_ffn: twice ffn_dim on a double-wide shared layer)
    bool shared;                      // a shared layer: no k or v of its own, kv the source layer's rows
    const uint16_t *attn_norm, *bqkv, *mlp_norm;
    const uint16_t *q_norm, *k_norm;  // (dims.hd) each, with qk_norm; else null
    const float *inv_freq;            // the layer's RoPE frequencies (rope_dim or dims.hd, halved)
    const uint16_t *post_attn_norm, *post_ffn_norm;  // (dim) each, with post_norms; else null
    int window;                       // the positions its attention reads (0: all)
    Weight wq, wk, wv, wo, w_gate_up, w_down;
    // A mixture of experts' layer: the router (bf16, the shared expert's gate row after it), the
    // experts' [gates; ups] and downs, the shared expert's [gate; up] and down.
    Weight router, e_gate_up, e_down, s_gate_up, s_down;
    Weight wq_gate;  // with attn_gate: the gate's rows, after Wv (a run of one format reads them too)
    // gpt-oss's, null where the config has none: each query head's sink logit, Wo's bias, the
    // router's bias, the experts' gate biases (their up biases follow at n_experts * expert_ffn_dim)
    // and down biases (bf16 each).
    const uint16_t *sinks, *bo, *router_bias, *e_gate_up_bias, *e_down_bias;
    const uint16_t *layer_scalar;     // with layer_scalar: the layer's output factor (bf16); else null
    // The experts beside the dense FFN (experts_beside), null elsewhere: the experts' input norm, the
    // dense FFN's and the experts' output norms, the router's input factors (dim each), each
    // expert's weight's factor (n_experts).
    const uint16_t *moe_norm, *ffn_out_norm, *moe_out_norm, *router_scale, *expert_scale;
    // The per-layer input's (ple_dim), null elsewhere: its gate, its out product, its norm.
    Weight ple_gate, ple_out;
    const uint16_t *ple_post_norm;
    // A gated DeltaNet layer (deltanet.cuh): DN_QKV, DN_Z, DN_B, DN_A one after the other; the out
    // projection; the convolution, the decay's log rate, dt's bias and the gated norm (bf16); the
    // layer's DN_SLOTS state slots.
    bool dn;
    Weight dn_in, dn_z, dn_b, dn_a, dn_out;
    const uint16_t *dn_conv, *dn_a_log, *dn_dt_bias, *dn_norm;
    float *dn_state;
    KvCache kv;  // an attention layer's rows (attention_ops.cuh); null pointers on a DeltaNet layer
};

// The parts of a layer's input product, each one matrix of its own format and rows, lying one
// after the other in the weights: ATTN_IN's Wq, Wk, Wv and, with attn_gate, the gate's rows;
// DN_IN's DN_QKV, DN_Z, DN_B, DN_A.
struct InParts {
    Weight w[4];
    int32_t rows[4];
    int count;
};

// The runs of parts that share a format, in order: fn(weight, rows, at) for each, `at` the run's
// first row (a run is one product: its parts lie one after the other).
template <class Fn>
int part_runs(const InParts &in, Fn fn) {
    int32_t at = 0;
    for (int i = 0; i < in.count;) {
        int j = i, n = 0;
        while (j < in.count && in.w[j].format == in.w[i].format) n += in.rows[j++];
        const int st = fn(in.w[i], n, at);
        if (st != ARC_OK) return st;
        at += n;
        i = j;
    }
    return ARC_OK;
}

struct ModelParts {
    arc_context *ctx;
    arc_model_config cfg;
    AttnDims most;  // each field the largest of every layer's (the buffers' sizes)
    int32_t most_ffn;  // the widest layer's FFN (the buffers' sizes)
    DeltaNetDims dn;
    const uint16_t *embed, *final_norm;
    Weight lm_head;  // the embedding when tied
    // The per-layer embeddings' (ple_dim), null elsewhere: the table, the projection, its norm.
    const uint16_t *ple_embed, *ple_norm;
    Weight ple_projection;
    float *x, *qkv, *att, *h, *scratch;  // the decode's activations (dim, most.qkv_rows, att_dim, ffn_dim)
    float *t;                            // with post_norms: a product's output before its norm (dim)
    float *e;                            // with experts_beside: the experts' sum before its norm (dim)
    float *ple, *pg;                     // with ple_dim: the token's per-layer inputs (n_layers * ple_dim), a gate (ple_dim)
    float *router;                       // MoE: the router's logits (n_experts + 1)
    int32_t *route_ids;                  // MoE: the chosen experts (n_experts_used), then their
    float *route_w;                      // weights and the shared expert's (n_experts_used + 1)
    float *logits;
    PrefillBuffers *prefill;
    SpecBuffers *spec;
    uint64_t dequant_elems;  // weights of the largest quantized matrix the prefill reads (0: none)
};

ModelParts model_parts(arc_model *m);
LayerParts model_layer(const arc_model *m, int layer);
// ARC_OK, or the error naming the first tensor the forward needs that was never uploaded, as
// reported by entry point `who`.
int model_check_uploaded(const arc_model *m, const char *who);

// What every norm of a model adds to its stored weights: 1 where they are stored less one
// (arc_model_config.norm_plus_one), else 0. The internal launchers take it beside eps; the public
// arc_op_* entry points keep 0.
inline float norm_offset(const arc_model_config &c) { return c.norm_plus_one ? 1.0f : 0.0f; }

// An RMSNorm as a launcher applies it: x * rsqrt(mean(x^2) + eps) * (add + w), w bf16.
struct RmsNorm {
    const uint16_t *w = nullptr;
    float eps = 0.0f;
    float add = 0.0f;  // norm_offset
};
// A model's norm of weights w: its config's eps and norm_offset.
inline RmsNorm model_norm(const arc_model_config &c, const uint16_t *w) { return {w, c.rms_eps, norm_offset(c)}; }
