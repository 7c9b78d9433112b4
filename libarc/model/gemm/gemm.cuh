// gemm.cuh -- the prefill's matrix products as their callers see them (gemm.cu, gemm_quant.cu):
// the arguments of one product, and the launchers over bf16, packed and grouped weights. The
// tile's device code is gemm_tile.cuh's.
#pragma once

#include "internal.cuh"
#include "model/parts.cuh"

// One product as its callers name it: c (m, ldc) columns [0, n) = a W^T (+ bias) (+ c when
// accumulate), W (n, k); or gated, h (m, n) = bf16(act(a Wg^T) * (a Wu^T)), W = [Wg; Wu] (2 n, k).
// a bf16 (m, k); fields not named are zero (no bias, no accumulate).
struct GemmIo {
    const uint16_t *a = nullptr;
    int32_t m = 0, n = 0, k = 0;
    const uint16_t *bias = nullptr;
    int32_t accumulate = 0;
    float *c = nullptr;
    int32_t ldc = 0;
    int act = ARC_ACT_SILU;  // gated: the GLU's arc_activation
    uint16_t *h = nullptr;
};

enum { GEMM_MAX_N = 65535 * 64 };  // rows of W: the grid's y extent counts tiles of at least 64

enum GemmEpilogue { EPI_STORE = 0, EPI_ACCUMULATE = 1, EPI_SWIGLU = 2 };

struct GemmArgs {
    const void *w;          // (n, k) bf16, or packed rows of a quantized format; SWIGLU: [Wg; Wu] (2 n, k)
    const uint16_t *a;      // (m, k) bf16
    int m, n, k;            // n: output columns (SWIGLU: of h)
    const uint16_t *bias;   // (n) or null, added before c (ACCUMULATE); SWIGLU: the gate's, the up's at up_bias
    float *c;               // (m, ldc) float32, columns [0, n) written: STORE, ACCUMULATE
    int ldc;
    uint16_t *h;            // (m, n) bf16: SWIGLU
    int act;                // SWIGLU: the arc_activation of the GLU
    // A grouped product (a mixture of experts' prefill, moe.cu), where offsets is not null: block
    // (x, y, z) works for expert z of `groups`, whose rows are rows offsets[z]..offsets[z + 1] of
    // the sorted order (m: the most any expert may have). Its row i reads A's row a_rows[i] (null:
    // the sorted row itself) and writes the sorted row; W advances w_step bytes an expert, and
    // SWIGLU's up rows lie up_rows rows after the gate rows (0: n).
    const int32_t *offsets = nullptr, *a_rows = nullptr;
    uint64_t w_step = 0;
    int up_rows = 0, groups = 1;
    // The bias advances bias_step elements an expert (gpt-oss's experts' biases); SWIGLU's up
    // biases lie up_bias elements after the gate's.
    uint64_t bias_step = 0;
    int up_bias = 0;
};

// Checks a product's arguments common to every entry point (pointers are checked by each).
int check_gemm(const char *who, const GemmArgs &p, int epilogue);
// The product of p over packed weights of a quantized format (gemm_quant.cu), p checked.
int gemm_quant(arc_context *ctx, const char *who, int32_t format, const GemmArgs &p, int epilogue);
// A grouped product (p.offsets set) over weights of `format`: gemm.cu's smallest tile for bf16,
// gemm_quant.cu's kernel for packed weights; epilogue STORE or SWIGLU.
int gemm_grouped(arc_context *ctx, const char *who, int32_t format, const GemmArgs &p, int epilogue);

// The prefill's products over a Weight of any format: c (m, ldc) columns [0, n) = a W^T (+ bias)
// (+ c), as arc_op_gemm_bf16; h (m, n) = bf16(act(a Wg^T) * (a Wu^T)), as arc_op_gemm_swiglu_bf16.
// A quantized W is read packed (gemm_quant.cu), giving the bits of the bf16 product over
// arc_op_dequantize's matrix; arc_model_prefill does so for chunks of up to QUANT_DIRECT_ROWS
// rows, and dequantizes once for longer ones, where tensor-core time outweighs the bytes (gemm.cu).
enum { QUANT_DIRECT_ROWS = 256 };
int gemm_weight(arc_context *ctx, const char *who, Weight w, const GemmIo &io);
int gemm_glu_weight(arc_context *ctx, const char *who, Weight w, const GemmIo &io);

// h (m, n) = bf16(act(a Wg^T) * (a Wu^T)), w_gate_up = [Wg; Wu] (2 n, k) bf16, as
// arc_op_gemm_swiglu_bf16 under io.act; where the product fills an sm_90 GPU, it runs on
// gemm_sm90.cu in chunks of scratch_rows rows of a through scratch (scratch_rows, 2 n) float32,
// then the GLU.
int gemm_swiglu_rows(arc_context *ctx, const char *who, const uint16_t *w_gate_up, const GemmIo &io, float *scratch,
                     int32_t scratch_rows);
