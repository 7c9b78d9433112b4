// forward.cu -- the forward of one token, enqueued on the context's stream with no allocation,
// no host wait and no host decision on device data, so that it can be captured into a graph once
// and replayed.
//
// Per layer it launches 5 kernels (one more GEMV where Wq, Wk and Wv differ in format):
//   1 gemv         qkv = [Wq; Wk; Wv] @ rmsnorm(x, attn_norm) (+ [bq; bk; bv])         qkv = [Wq; Wk; Wv] @ rmsnorm(x, attn_norm) (+ [bq; bk; bv])
//   2 attention    rotate q and k (RoPE), k and v -> KV cache at pos (bf16), then attention over
//                  chunks of positions, the last block of a head combining them -> att
//   3 gemv         x += Wo @ att
//   4 gemv_swiglu  h = silu(Wgate @ n) * (Wup @ n), n = rmsnorm(x, mlp_norm)
//   5 gemv         x += Wdown @ h
// plus the embedding before the layers and logits = lm_head @ rmsnorm(x, final_norm) after (in the
// greedy step graph with the argmax and its commit in the same kernel: arc_model_forward_commit).
// Every kernel is launched with programmatic dependent launch (kernels.cuh: pdl_wait): the next
// one is scheduled while the previous one finishes, and waits on the device for its data. Work
// enqueued after the forward with a plain launch or a copy is ordered as usual. A GEMV's weights
// may be bf16 or quantized (arc_format): gemv_weight and its kin pick the kernel.
#include "kernels.cuh"

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
    const uint32_t *token = nullptr;
    const int32_t *pos = nullptr;
    ARC_TRY(arc_loop_token_input(loop, &token, &pos));

    // Shapes, activations and the global weights, named as the calls below use them.
    const int32_t dim = c.dim, ffn_dim = c.ffn_dim, vocab = c.vocab, max_seq = c.max_seq;
    const int32_t n_heads = c.n_heads, n_kv_heads = c.n_kv_heads, hd = c.head_dim;
    const int32_t q_dim = parts.q_dim;
    const float eps = c.rms_eps;
    float *x = parts.x, *qkv = parts.qkv, *att = parts.att, *h = parts.h;
    float *scratch = parts.scratch, *logits = parts.logits;
    const uint16_t *embed = parts.embed, *final_norm = parts.final_norm;
    const Weight lm_head = parts.lm_head;
    const float *inv_freq = parts.inv_freq;
    const uint16_t *no_bias = nullptr, *no_norm = nullptr;

    // x = embed[token]
    ARC_TRY(arc_op_embedding(ctx, embed, vocab, dim, token, x));
    for (int l = 0; l < c.n_layers; ++l) {
        const LayerParts lw = model_layer(model, l);
        uint16_t *k_cache = lw.k_cache, *v_cache = lw.v_cache;

        // qkv = [Wq; Wk; Wv] @ rmsnorm(x, attn_norm) (+ [bq; bk; bv]), one GEMV a run of one format
        ARC_TRY(gemv_qkv(ctx, lw, q_dim, parts.kv_dim, x, dim, eps, qkv));
        // q, k rotated at pos; k, v -> cache at pos; att = softmax(q k^T / sqrt(hd)) v over 0..pos
        ARC_TRY(arc_op_attention(ctx, qkv, inv_freq, k_cache, v_cache, n_heads, n_kv_heads, hd, max_seq, pos,
                                 scratch, att));
        // x += Wo @ att
        ARC_TRY(gemv_weight(ctx, lw.wo, att, dim, q_dim, no_bias, no_norm, /*eps=*/0.0f, /*accumulate=*/1, x));
        // h = silu(Wgate @ n) * (Wup @ n), n = rmsnorm(x, mlp_norm)
        ARC_TRY(gemv_swiglu_weight(ctx, lw.w_gate_up, x, ffn_dim, dim, lw.mlp_norm, eps, h));
        // x += Wdown @ h
        ARC_TRY(gemv_weight(ctx, lw.w_down, h, dim, ffn_dim, no_bias, no_norm, /*eps=*/0.0f, /*accumulate=*/1, x));
    }
    // logits = lm_head @ rmsnorm(x, final_norm); with commit, their argmax -> the loop
    if (commit) return gemv_argmax_weight(ctx, who, lm_head, x, vocab, dim, final_norm, eps, logits, loop);
    ARC_TRY(gemv_weight(ctx, lm_head, x, vocab, dim, no_bias, final_norm, eps, /*accumulate=*/0, logits));
    return ARC_OK;
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
