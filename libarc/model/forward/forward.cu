// forward.cu -- the forward of one token, enqueued on the context's stream with no allocation,
// no host wait and no host decision on device data, so that it can be captured into a graph once
// and replayed.
//
// The embedding, then each layer's program (layer.cuh) as the decode runs its ops:
//   ATTN_IN   gemv         qkv = [Wq; Wk; Wv] @ rmsnorm(x, attn_norm) (+ [bq; bk; bv]), one GEMV a
//                          run of parts of one format
//   QK_NORM   head_norm    each q and k head RMS-normed (norms.cu)
//   ATTEND    attention    rotate q and k (the layer's RoPE), k and v -> KV cache at pos (bf16),
//                          then attention over chunks of positions, the last block of a head
//                          combining them -> att
//   ATTN_OUT  gemv         x += Wo @ att
//   FFN_IN    gemv_swiglu  h = act(Wgate @ n) * (Wup @ n), n = rmsnorm(x, mlp_norm)
//   FFN_OUT   gemv         x += Wdown @ h
//   ATTN_OUT_NORM, FFN_OUT_NORM  the same product to t, then add_norm_rows: x += rmsnorm(t)
//   (a rank of a split model, arc_comm_create: its products summed over the ranks, the residual
//   added by rank 0's, before x or the norm takes them; the lm_head is whole on every rank, whose
//   identical x gives each the same token to commit)
//   MOE_IN, MOE_OUT  a mixture of experts' router, routing and chosen experts (moe.cu)
//   EXPERTS_BESIDE   the dense FFN's down product and the experts beside it, each normed, summed,
//                    normed and added (moe.cu: moe_decode_beside)
//   PER_LAYER_INPUT  gemv, ple_gate, gemv, add_norm_rows: the layer's per-layer input (ple.cu),
//                    the token's inputs made after the embedding (PLE_PROJECTION @ x, ple_inputs)
//   LAYER_SCALAR scale_rows  x *= the layer's scalar
// and logits = lm_head @ rmsnorm(x, final_norm) after (in the greedy step graph with the argmax
// and its commit in the same kernel: arc_model_forward_commit; with final_softcap the logits
// capped by their own kernel, then the loop's argmax and commit). Every kernel is launched with
// programmatic dependent launch (launch.cuh: pdl_wait): the next one is scheduled while the
// previous one finishes, and waits on the device for its data. Work enqueued after the forward
// with a plain launch or a copy is ordered as usual. A GEMV's weights may be bf16 or quantized
// (arc_format): gemv_weight and its kin pick the kernel.
#include "layer.cuh"
#include "model/attention_ops.cuh"
#include "model/embedding.cuh"
#include "model/moe/moe.cuh"
#include "model/norms.cuh"
#include "model/ple.cuh"
#include "model/products.cuh"
#include "model/scales.cuh"

// The decode's form of each op: one row, GEMVs, the token's position read on the device.
struct DecodeOps {
    const ModelParts &p;
    const int32_t *pos;

    int attn_in(const LayerParts &lw) {
        return gemv_parts(p.ctx, attn_in_parts(p.cfg, lw), lw.bqkv,
                          {.x = p.x, .cols = p.cfg.dim, .norm_weight = lw.attn_norm, .eps = p.cfg.rms_eps,
                           .norm_add = norm_offset(p.cfg), .y = p.qkv});
    }
    int attn_gate(const LayerParts &lw) {
        const AttnDims &d = lw.dims;
        return launch_attn_gate(p.ctx, p.att, nullptr, p.qkv + d.q_dim + 2 * d.kv_dim, d.qkv_rows, 1, d.q_dim);
    }
    int dn_in(const LayerParts &lw) {
        return gemv_parts(p.ctx, dn_in_parts(p.cfg, p.dn, lw), nullptr,
                          {.x = p.x, .cols = p.cfg.dim, .norm_weight = lw.attn_norm, .eps = p.cfg.rms_eps,
                           .norm_add = norm_offset(p.cfg), .y = p.qkv});
    }
    int dn_step(const LayerParts &lw) {
        return deltanet_layer(p.ctx, p.cfg, p.dn, lw, {.u = p.qkv, .rows = 1, .pos = pos, .early = true, .out = p.att});
    }
    int dn_out(const LayerParts &lw) {
        return gemv_weight(p.ctx, lw.dn_out,
                           {.x = p.att, .rows = p.cfg.dim, .cols = p.dn.v_dim, .accumulate = 1, .y = p.x});
    }
    int qk_norm(const LayerParts &lw) {
        return launch_head_norm(p.ctx, head_norm_args(p.cfg, lw, p.qkv, 1));
    }
    int attend(const LayerParts &lw) {
        const arc_model_config &c = p.cfg;
        return attention_layer(p.ctx, p.qkv, layer_attn(c, lw), lw.kv, c.n_heads, lw.dims.n_kv, lw.dims.hd,
                               c.max_seq, pos, p.scratch, p.att);
    }
    // Under tensor parallelism (a rank's shard, arc_comm_create): x += the ranks' products summed
    // (the bias added once, by rank 0).
    int attn_out(const LayerParts &lw) {
        const bool first = comm_rank(p.ctx) == 0;
        ARC_TRY(gemv_weight(p.ctx, lw.wo,
                            {.x = p.att, .rows = p.cfg.dim, .cols = lw.dims.q_dim, .bias = first ? lw.bo : nullptr,
                             .accumulate = first, .y = p.x}));
        return comm_sum(p.ctx, p.x, p.cfg.dim);
    }
    // h reaches the down GEMV already quantized where both matrices are (quant.cu: ffn_handoff).
    bool hand(const LayerParts &lw) const { return ffn_handoff(lw.w_gate_up, lw.w_down, lw.ffn); }
    int ffn_in(const LayerParts &lw) {
        return gemv_swiglu_weight(p.ctx, lw.w_gate_up,
                                  {.x = p.x, .rows = lw.ffn, .cols = p.cfg.dim, .norm_weight = lw.mlp_norm,
                                   .eps = p.cfg.rms_eps, .norm_add = norm_offset(p.cfg), .act = p.cfg.activation,
                                   .y = p.h},
                                  hand(lw));
    }
    int ffn_out(const LayerParts &lw) {
        ARC_TRY(gemv_weight(p.ctx, lw.w_down,
                            {.x = p.h, .rows = p.cfg.dim, .cols = lw.ffn, .accumulate = comm_rank(p.ctx) == 0,
                             .y = p.x},
                            hand(lw)));
        return comm_sum(p.ctx, p.x, p.cfg.dim);
    }
    int attn_out_norm(const LayerParts &lw) {
        ARC_TRY(gemv_weight(p.ctx, lw.wo, {.x = p.att, .rows = p.cfg.dim, .cols = lw.dims.q_dim, .y = p.t}));
        ARC_TRY(comm_sum(p.ctx, p.t, p.cfg.dim));
        return launch_add_norm_rows(p.ctx, p.x, p.t, 1, p.cfg.dim, model_norm(p.cfg, lw.post_attn_norm));
    }
    int ffn_out_norm(const LayerParts &lw) {
        ARC_TRY(
            gemv_weight(p.ctx, lw.w_down, {.x = p.h, .rows = p.cfg.dim, .cols = lw.ffn, .y = p.t}, hand(lw)));
        ARC_TRY(comm_sum(p.ctx, p.t, p.cfg.dim));
        return launch_add_norm_rows(p.ctx, p.x, p.t, 1, p.cfg.dim, model_norm(p.cfg, lw.post_ffn_norm));
    }
    int moe_in(const LayerParts &lw) { return moe_decode_in(p, lw); }
    int moe_out(const LayerParts &lw) { return moe_decode_out(p, lw); }
    int experts_beside(const LayerParts &lw) { return moe_decode_beside(p, lw); }
    // x += rmsnorm(PLE_OUT @ (gelu_tanh(PLE_GATE @ x) * the layer's input), PLE_POST_NORM)
    int per_layer_input(const LayerParts &lw) {
        const arc_model_config &c = p.cfg;
        ARC_TRY(gemv_weight(p.ctx, lw.ple_gate, {.x = p.x, .rows = c.ple_dim, .cols = c.dim, .y = p.pg}));
        ARC_TRY(launch_ple_gate(p, p.pg, p.ple, 1, lw.layer, nullptr));
        ARC_TRY(gemv_weight(p.ctx, lw.ple_out, {.x = p.pg, .rows = c.dim, .cols = c.ple_dim, .y = p.t}));
        return launch_add_norm_rows(p.ctx, p.x, p.t, 1, c.dim, model_norm(c, lw.ple_post_norm));
    }
    int layer_scalar(const LayerParts &lw) { return launch_scale_rows(p.ctx, p.x, 1, p.cfg.dim, lw.layer_scalar); }
};

// The forward; with commit, its lm_head takes the argmax and commits it to the loop.
static int forward(arc_model *model, arc_loop *loop, bool commit, const char *who) {
    ARC_REQUIRE_AS(who, model && loop, "null argument");
    const ModelParts parts = model_parts(model);
    arc_context *ctx = parts.ctx;
    const arc_model_config &c = parts.cfg;
    ARC_REQUIRE_AS(who, loop->ctx == ctx, "the loop and the model belong to different contexts");
    ARC_REQUIRE_AS(who, loop->vocab <= c.vocab, "the loop's vocab %d exceeds the model's %d", loop->vocab, c.vocab);
    ARC_REQUIRE_AS(who, loop->max_seq <= c.max_seq, "the loop's max_seq %d exceeds the model's %d",
                   loop->max_seq, c.max_seq);
    ARC_TRY(model_check_uploaded(model, who));
    ARC_REQUIRE_AS(who, !(ctx->comm && c.n_experts), "a mixture of experts does not split over ranks yet");
    ARC_REQUIRE_AS(who, !(ctx->comm && (c.attn_gate || dn_layer_count(c))),
                   "gated attention and DeltaNet layers do not split over ranks yet");
    const uint32_t *token = nullptr;
    const int32_t *pos = nullptr;
    ARC_TRY(arc_loop_token_input(loop, &token, &pos));

    // x = embed[token]
    ARC_TRY(embedding_scaled(ctx, {.table = parts.embed, .vocab = c.vocab, .dim = c.dim, .scale = embed_scale(c)},
                             token, parts.x));
    if (c.ple_dim) {  // the token's per-layer inputs: PLE_PROJECTION @ x, then ple.cu's
        ARC_TRY(gemv_weight(ctx, parts.ple_projection,
                            {.x = parts.x, .rows = c.n_layers * c.ple_dim, .cols = c.dim, .y = parts.ple}));
        ARC_TRY(launch_ple_inputs(parts, parts.ple, reinterpret_cast<const int32_t *>(token), 1));
    }
    DecodeOps ops{parts, pos};
    ARC_TRY(run_layers(model, parts, ops));
    // logits = lm_head @ rmsnorm(x, final_norm); with commit, their argmax -> the loop
    const GemvIo head{.x = parts.x, .rows = c.vocab, .cols = c.dim, .norm_weight = parts.final_norm, .eps = c.rms_eps,
                      .norm_add = norm_offset(c), .y = parts.logits};
    if (c.final_softcap > 0.0f) {  // the logits capped, then (committing) their argmax as the loop's own
        ARC_TRY(gemv_weight(ctx, parts.lm_head, head));
        ARC_TRY(launch_softcap_rows(ctx, parts.logits, 1, c.vocab, c.vocab, c.final_softcap));
        return commit ? arc_loop_enqueue_sample_commit(loop, parts.logits, c.vocab) : ARC_OK;
    }
    if (commit) return gemv_argmax_weight(ctx, who, parts.lm_head, head, loop);
    return gemv_weight(ctx, parts.lm_head, head);
}

extern "C" int arc_model_forward(arc_model *model, arc_loop *loop) { return forward(model, loop, false, __func__); }

extern "C" int arc_model_forward_commit(arc_model *model, arc_loop *loop) {
    return forward(model, loop, true, __func__);
}

extern "C" int arc_model_logits(arc_model *model, const float **logits, int32_t *vocab) {
    ARC_REQUIRE(model && logits && vocab, "null argument");
    const ModelParts parts = model_parts(model);
    *logits = parts.logits;
    *vocab = parts.cfg.vocab;
    return ARC_OK;
}
