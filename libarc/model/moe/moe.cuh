// moe.cuh -- a mixture of experts' layer on the device (moe.cu): what the decode's, the prefill's
// and the model's code call. The routing is data on the device from the router's logits on; no
// forward sends it to the host or picks a launch by it.
#pragma once

#include "model/buffers.cuh"
#include "model/gemv/gemv_common.cuh"

enum { MOE_MAX_EXPERTS = 1024 };  // n_experts <= MOE_MAX_EXPERTS on the GPU

// The GPU's limits on a config's experts (arc_model_create), as entry point `who`.
int check_moe_limits(const arc_model_config &c, const char *who);
// The routed GEMV over a Weight of any format (gemv_common.cuh's GemvRoute): gated, y (rt.count *
// rt.seg) = the chosen experts' GLUs (io.act) of rmsnorm(x, norm_weight) times their scales; else y
// (rows) += the chosen experts' products of x's rt.count segments of rt.seg columns, summed
// (quant.cu). io: no accumulate (the sum is the routed product's own); io.bias: the experts'
// biases or null (gemv_common.cuh's gemv_finish_task: gated, the gate's then at rt.up the up's;
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
// The prefill's routed rows for chunks of up to `rows` tokens (arc_model_prefill_reserve).
int moe_rows_reserve(arc_context *ctx, const arc_model_config &c, int32_t rows, MoeRows *m);
void moe_rows_release(MoeRows *m);
