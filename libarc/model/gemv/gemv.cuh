// gemv.cuh -- one GEMV as its callers name it (GemvIo), and the bf16 GEMV's launchers (gemv.cu,
// gemv_rows.cu) beyond their arc_op_* entry points: with the norm's factors, the argmax of the
// lm_head, the GLU, and over m rows.
#pragma once

#include "internal.cuh"

// The GEMV stages its input as float32 in shared memory: 192 KiB of it at most.
enum { GEMV_MAX_COLS = 49152 };

// One GEMV: y = W @ n(x) (+ bias) (+ y when accumulate), W (rows, cols), n the fused RMSNorm with
// norm_weight (none where it is null): x * rsqrt(mean(x^2) + eps) * (norm_add + norm_weight).
// Gated, W is [gates; ups] (2 rows, cols) and y = act(gate) * up. The rows GEMVs take m inputs
// (x: m rows of cols), write y's rows ldy apart, and stage them in scratch. Callers name what
// they pass, the rest is zero (no bias, no norm, no accumulate):
//   gemv_weight(ctx, w, {.x = x, .rows = n, .cols = k, .norm_weight = g, .eps = eps, .y = y})
struct GemvIo {
    const float *x = nullptr;
    int32_t m = 1;  // the rows GEMVs: rows of x
    int32_t rows = 0, cols = 0;
    const uint16_t *bias = nullptr;
    const uint16_t *norm_weight = nullptr;
    float eps = 0.0f;
    float norm_add = 0.0f;  // what the norm adds to its weights (arc_model_config.norm_plus_one: 1)
    int32_t accumulate = 0;
    int32_t act = ARC_ACT_SILU;  // a gated GEMV's arc_activation
    float *scratch = nullptr;    // the rows GEMVs: m * cols floats, 16-byte aligned (the staged rows)
    float *y = nullptr;
    int32_t ldy = 0;  // the rows GEMVs: y's rows this far apart (>= rows)
};

// Where the lm_head's argmax goes: committed to loop when it is not null, else written to *out
// and *value_out.
struct ArgmaxTo {
    arc_loop *loop = nullptr;
    int32_t *out = nullptr;
    float *value_out = nullptr;
};

// The bf16 GEMV over m <= 8 rows (gemv_rows.cu), gated or not; with a norm, n(x) goes through
// io.scratch (m, cols). Each row's output has the bits of the one-row GEMV's.
int gemv_rows(arc_context *ctx, const char *who, const uint16_t *w, const GemvIo &io, bool gated);

// The lm_head GEMV with the argmax of its rows (gemv.cu); `who` names the entry point in errors.
// io: no bias, no accumulate.
int launch_gemv_argmax(arc_context *ctx, const char *who, const uint16_t *w, const GemvIo &io, const ArgmaxTo &to);
// arc_op_gemv with the norm's factors norm_add + w (gemv.cu); `who` names the caller.
int launch_gemv_rows(arc_context *ctx, const char *who, const uint16_t *w, const GemvIo &io);
// arc_op_gemv_swiglu under io.act (gemv.cu): no bias, no accumulate; `who` names the caller.
int gemv_glu(arc_context *ctx, const char *who, const uint16_t *w_gate_up, const GemvIo &io);
