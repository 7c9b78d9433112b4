// moe.cuh -- a mixture of experts' layer on the device (moe.cu): what the decode's, the prefill's
// and the model's code call. The routing is data on the device from the router's logits on; no
// forward sends it to the host or picks a launch by it.
#pragma once

#include "model/buffers.cuh"
#include "model/gemv/gemv_common.cuh"
#include "model/norms.cuh"

enum { MOE_MAX_EXPERTS = 1024 };  // n_experts <= MOE_MAX_EXPERTS on the GPU

// The three norms of a layer with the experts beside its FFN: the dense FFN's output's, the experts'
// sum's, and their sum's.
inline NormPair beside_norms(const arc_model_config &c, const LayerParts &lw) {
    return {model_norm(c, lw.ffn_out_norm), model_norm(c, lw.moe_out_norm), model_norm(c, lw.post_ffn_norm)};
}

// The GPU's limits on a config's experts (arc_model_create), as entry point `who`.
int check_moe_limits(const arc_model_config &c, const char *who);
// The routed GEMV over a Weight of any format (gemv_common.cuh's GemvRoute): gated, y (rt.count *
// rt.seg) = the chosen experts' GLUs (io.act) of rmsnorm(x, norm_weight) times their scales; else y
// (rows) = the chosen experts' products of x's rt.count segments of rt.seg columns, summed (+ y
// with io.accumulate) (quant.cu). io.bias: the experts' biases or null (gemv_common.cuh's gemv_finish_task: gated, the gate's then at rt.up the up's;
// not gated, the down's, each times its expert's weight rt.scale[j]).
int gemv_routed_weight(arc_context *ctx, Weight w, const GemvIo &io, bool gated, const GemvRoute &rt);
int launch_gemv_routed(arc_context *ctx, const char *who, const uint16_t *w, const GemvIo &io, bool gated,
                       const GemvRoute &rt);

// The decode's MoE ops on the step's one row (forward.cu's DecodeOps).
int moe_decode_in(const ModelParts &p, const LayerParts &lw);
int moe_decode_out(const ModelParts &p, const LayerParts &lw);
// The prefill's, on a chunk of n rows whose normed inputs are in prefill->xn (prefill.cu).
int moe_prefill_in(const ModelParts &p, const LayerParts &lw, int n);
int moe_prefill_out(const ModelParts &p, const LayerParts &lw, int n);
// The experts beside the dense FFN (ARC_OP_EXPERTS_BESIDE), the dense GLU's output already in h:
// the decode's on its row, the prefill's on a chunk of n rows (prefill->h, prefill->x).
// moe_prefill_route routes the rows normed into prefill->xn (the router's input); the experts of
// moe_prefill_beside read the rows normed there after it (by MOE_NORM), the dense FFN's output in
// prefill->t.
int moe_decode_beside(const ModelParts &p, const LayerParts &lw);
int moe_prefill_route(const ModelParts &p, const LayerParts &lw, int n);
int moe_prefill_beside(const ModelParts &p, const LayerParts &lw, int n);
// The prefill's routed rows for chunks of up to `rows` tokens (arc_model_prefill_reserve).
int moe_rows_reserve(arc_context *ctx, const arc_model_config &c, int32_t rows, MoeRows *m);
void moe_rows_release(MoeRows *m);
