// scales.cuh -- the layer program's and the lm_head's elementwise factors (scales.cu): a layer's
// output scalar (ARC_OP_LAYER_SCALAR) and the logits' soft cap (arc_model_config.final_softcap).
#pragma once

#include "internal.cuh"

// x[r][0..dim) *= s for rows r, s one bf16 word (LAYER_SCALAR). Limits: dim % 4 == 0, x 16-byte aligned.
int launch_scale_rows(arc_context *ctx, float *x, int32_t rows, int32_t dim, const uint16_t *s);
// y[r][0..n) = cap * tanh(y[r][i] / cap) in place for rows r, `ld` floats apart (cap > 0).
int launch_softcap_rows(arc_context *ctx, float *y, int32_t rows, int32_t n, int32_t ld, float cap);
