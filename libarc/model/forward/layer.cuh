// layer.cuh -- the layer program (arc.h: arc_layer_op) and the loop that runs it: every forward
// (the decode step, the speculative verify, the prefill) walks the same ops of each layer, each op
// enqueued in that forward's own form. A family's differences live in the config and so in the
// program; no forward writes the sequence of a layer out itself.
#pragma once

#include <math.h>

#include "launch.cuh"
#include "model/attention_ops.cuh"
#include "model/deltanet.cuh"
#include "model/parts.cuh"

// The ops of layer `layer` of a model of config c, in order, into ops (ARC_MAX_LAYER_OPS entries);
// returns their count (model.cu). layer_window: the positions the layer's attention reads (0: all).
int layer_program(const arc_model_config &c, int layer, int32_t *ops);
int layer_window(const arc_model_config &c, int layer);
// A layer's attention dims (parts.cuh: AttnDims).
AttnDims layer_dims(const arc_model_config &c, int layer);
// Whether layer `layer` takes the global dims (attends every position).
bool layer_global(const arc_model_config &c, int layer);
// The layer whose cache layer `layer` attends (itself, or for a shared layer the last earlier one
// of its kind; -1: none), whether it is a shared layer, and its FFN's width (arc_model_config:
// kv_shared_layers, double_wide_ffn).
int layer_kv_source(const arc_model_config &c, int layer);
bool layer_shared(const arc_model_config &c, int layer);
int32_t layer_ffn(const arc_model_config &c, int layer);
// The largest of every layer's dims (each field its own maximum): what the buffers hold.
AttnDims max_layer_dims(const arc_model_config &c);
// Whether layer `layer` is a mixture-of-experts layer (arc.h: arc_model_config's n_experts..), and
// the checks of the MoE fields, as entry point `who` (ARC_OK when they hold).
bool layer_moe(const arc_model_config &c, int layer);
// The tensor table's rows for the MoE tensors (arc.h: ARC_TENSOR_MOE_ROUTER..): 0 off MoE layers.
void moe_table_shape(const arc_model_config &c, int t, int layer, uint64_t *rows, uint64_t *cols);
// The tensor table (model.cu): tensor t's rows and columns in layer `layer` of a model of config c
// (rows 0: absent there); whether t is a per-layer tensor; its arc.h name.
void table_shape(const arc_model_config &c, int t, int layer, uint64_t *rows, uint64_t *cols);
bool tensor_per_layer(int t);
bool tensor_is_matrix(int t);  // a matrix: what a quantized format may hold
const char *tensor_name(int t);
int check_moe(const arc_model_config &c, const char *who);
// The checks of Gemma 4's fields (arc_model_config: global_head_dim..final_softcap, ple_dim..).
int check_gemma4_fields(const arc_model_config &c, const char *who);
// arc_model_create's checks of a config: everything its kernels take (config.cu).
int check_config(const arc_model_config *c);

// The embedding rows' factor.
inline float embed_scale(const arc_model_config &c) { return c.embed_scale > 0.0f ? c.embed_scale : 1.0f; }

// A layer's attention: its own RoPE frequencies, the config's rotated elements (all of the layer's
// head where rope_dim is 0), RoPE factor and scores' factor, and the layer's window.
inline AttnSpec layer_attn(const arc_model_config &c, const LayerParts &lw) {
    const RopeArgs rope{lw.inv_freq, (c.rope_dim ? c.rope_dim : lw.dims.hd) / 2,
                        c.rope_factor > 0.0f ? c.rope_factor : 1.0f};
    const double scale = c.attn_scale > 0.0f ? (double)c.attn_scale : 1.0 / sqrt((double)lw.dims.hd);
    return AttnSpec{rope, scale, lw.window, lw.sinks, lw.shared};
}

// The parts of ATTN_IN's and DN_IN's products (parts.cuh's InParts).
// A shared layer's is q alone (kv_shared_layers takes no attn_gate).
inline InParts attn_in_parts(const arc_model_config &c, const LayerParts &lw) {
    const AttnDims &d = lw.dims;
    if (lw.shared) return {{lw.wq}, {d.q_dim}, 1};
    return {{lw.wq, lw.wk, lw.wv, lw.wq_gate}, {d.q_dim, d.kv_dim, d.kv_dim, d.q_dim}, c.attn_gate ? 4 : 3};
}
inline InParts dn_in_parts(const arc_model_config &c, const DeltaNetDims &d, const LayerParts &lw) {
    return {{lw.dn_in, lw.dn_z, lw.dn_b, lw.dn_a}, {d.conv_dim, d.v_dim, c.dn_v_heads, c.dn_v_heads}, 4};
}



// Runs every layer's program on `exec`: an object with one member per op (attn_in, qk_norm,
// attend, attn_out, ffn_in, ffn_out, attn_out_norm, ffn_out_norm, moe_in, moe_out, attn_gate,
// dn_in, dn_step, dn_out, layer_scalar, experts_beside, per_layer_input), each taking the layer's parts and enqueuing the op.
template <class Exec>
int run_layers(arc_model *model, const ModelParts &mp, Exec &exec) {
    int32_t ops[ARC_MAX_LAYER_OPS];
    for (int l = 0; l < mp.cfg.n_layers; ++l) {
        const LayerParts lw = model_layer(model, l);
        const int n = layer_program(mp.cfg, l, ops);
        for (int i = 0; i < n; ++i) {
            int st;
            switch (ops[i]) {
            case ARC_OP_ATTN_IN: st = exec.attn_in(lw); break;
            case ARC_OP_QK_NORM: st = exec.qk_norm(lw); break;
            case ARC_OP_ATTEND: st = exec.attend(lw); break;
            case ARC_OP_ATTN_OUT: st = exec.attn_out(lw); break;
            case ARC_OP_FFN_IN: st = exec.ffn_in(lw); break;
            case ARC_OP_FFN_OUT: st = exec.ffn_out(lw); break;
            case ARC_OP_ATTN_OUT_NORM: st = exec.attn_out_norm(lw); break;
            case ARC_OP_FFN_OUT_NORM: st = exec.ffn_out_norm(lw); break;
            case ARC_OP_MOE_IN: st = exec.moe_in(lw); break;
            case ARC_OP_MOE_OUT: st = exec.moe_out(lw); break;
            case ARC_OP_ATTN_GATE: st = exec.attn_gate(lw); break;
            case ARC_OP_DN_IN: st = exec.dn_in(lw); break;
            case ARC_OP_DN_STEP: st = exec.dn_step(lw); break;
            case ARC_OP_DN_OUT: st = exec.dn_out(lw); break;
            case ARC_OP_LAYER_SCALAR: st = exec.layer_scalar(lw); break;
            case ARC_OP_EXPERTS_BESIDE: st = exec.experts_beside(lw); break;
            case ARC_OP_PER_LAYER_INPUT: st = exec.per_layer_input(lw); break;
            default: st = arc_fail(ARC_INVALID_ARGUMENT, "run_layers", "layer %d: unknown op %d", l, ops[i]);
            }
            if (st != ARC_OK) return st;
        }
    }
    return ARC_OK;
}
