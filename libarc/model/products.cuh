// products.cuh -- the forwards' GEMVs over a Weight of any format: the bf16 GEMV (gemv.cu) or
// the quantized one (quant.cu, qgemv_rows.cu), whichever the weight's arc_format asks for. Each
// takes its GemvIo (gemv.cuh) with the fields it names.
#pragma once

#include "model/gemv/gemv.cuh"
#include "model/parts.cuh"

// The GEMVs over a Weight of any format (quant.cu): arc_op_gemv or arc_op_qgemv, and so on. With
// ffn_handoff true for the FFN's matrices, the SwiGLU GEMV (hand) gives the down GEMV (handed)
// its output already quantized (qinput.cuh), and the two run one after the other.
int gemv_weight(arc_context *ctx, Weight w, const GemvIo &io, bool handed = false);
// Gated under io.act: no bias, no accumulate.
int gemv_swiglu_weight(arc_context *ctx, Weight w, const GemvIo &io, bool hand = false);
bool ffn_handoff(Weight gate_up, Weight down, int32_t ffn_dim);
// The lm_head with its argmax committed to loop: no bias, no accumulate.
int gemv_argmax_weight(arc_context *ctx, const char *who, Weight w, const GemvIo &io, arc_loop *loop);
// y = [parts] @ n(x) (+ bias, over every part's rows): one GEMV for each run of parts of one format.
// io names x, cols, norm_weight, eps, norm_add and y.
int gemv_parts(arc_context *ctx, const InParts &in, const uint16_t *bias, const GemvIo &io);
// The verify's products over io.m <= 8 rows of a Weight of any format: gemv_rows (bf16) or the
// quantized rows GEMV (qgemv_rows.cu), each row of y (io.ldy apart) the bits of the one-row GEMV of
// that format. io.scratch: m * cols floats, 16-byte aligned (the normed rows, or the quantized ones).
int gemv_rows_weight(arc_context *ctx, const char *who, Weight w, const GemvIo &io, bool gated);
