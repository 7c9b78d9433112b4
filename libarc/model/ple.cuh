// ple.cuh -- Gemma 4's per-layer embeddings on the device (ple.cu; arc_model_config: ple_dim):
// each token's inputs to every layer, and a layer's ARC_OP_PER_LAYER_INPUT between its products.
#pragma once

#include "internal.cuh"
#include "model/parts.cuh"

// The per-layer inputs of `rows` tokens (ple: rows of n_layers * ple_dim floats, each holding the
// projection PLE_PROJECTION @ x of its token's scaled embedding x on entry): slice l of row r
// becomes (rmsnorm(slice * dim^-1/2, PLE_NORM) + PLE_EMBED[tokens[r]] slice l * sqrt(ple_dim)) *
// 2^-1/2, in place. A token outside [0, ple_vocab) makes its row NaN.
int launch_ple_inputs(const ModelParts &p, float *ple, const int32_t *tokens, int32_t rows);
// g[r] = gelu_tanh(g[r]) * ple[r]'s slice of `layer` for rows r of ple_dim floats (g: PLE_GATE's
// output); with gb, written as bf16 there instead (the prefill's product input).
int launch_ple_gate(const ModelParts &p, float *g, const float *ple, int32_t rows, int32_t layer, uint16_t *gb);
// The prefill's forms over a chunk of n rows (prefill->x): the rows' inputs into prefill->ple
// (after the embedding), and layer lw's ARC_OP_PER_LAYER_INPUT. The products' inputs are the rows
// rounded to bf16; their matrices are bf16 (never a quantized format: arc.h).
int ple_prefill_inputs(const ModelParts &p, const int32_t *tokens, int32_t n);
int ple_prefill_layer(const ModelParts &p, const LayerParts &lw, int32_t n);
