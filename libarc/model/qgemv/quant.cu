// quant.cu -- the entry points of the quantized formats: a row's size, the quantized GEMVs
// (checked here, launched from qgemv_*.cu), and the dequantization the prefill's matrix
// products read (each thread decodes one unit of 32 weights to bf16).
#include "model/forward/layer.cuh"
#include "model/moe/moe.cuh"
#include "model/products.cuh"
#include "model/tensor_core.cuh"
#include "qgemv.cuh"

enum { DEQUANT_THREADS = 256 };

int check_format_shape(const char *who, int32_t format, int32_t cols) {
    ARC_REQUIRE_AS(who, format_quantized(format), "format %d is not a quantized format (arc_format 1..%d)", format,
                   FORMAT_LAST);
    const int unit = format_super(format) ? QSUPER : QUNIT;
    ARC_REQUIRE_AS(who, cols > 0 && cols % unit == 0, "cols must be a positive multiple of %d for format %d, got %d",
                   unit, format, cols);
    return ARC_OK;
}

extern "C" int arc_format_row_bytes(int32_t format, int32_t cols, uint64_t *out) {
    ARC_REQUIRE(out, "out is null");
    if (format == ARC_FORMAT_BF16) {
        ARC_REQUIRE(cols > 0, "cols must be positive, got %d", cols);
        *out = 2ull * (uint64_t)cols;
        return ARC_OK;
    }
    ARC_TRY(check_format_shape(__func__, format, cols));
    *out = row_layout(format, cols).bytes;
    return ARC_OK;
}

static int launch_qgemv(arc_context *ctx, const char *who, const QgemvArgs &a, bool gated) {
    ARC_REQUIRE_AS(who, ctx, "ctx is null");
    ARC_TRY(check_format_shape(who, a.format, a.cols));
    ARC_TRY(check_gemv_io(who, a.w, a.x, a.rows, a.cols, a.norm_w, a.eps, a.y));
    ARC_REQUIRE_AS(who, !gated || a.rows <= INT32_MAX / 2, "rows %d too large", a.rows);
    ARC_REQUIRE_AS(who, !(gated && a.am), "the gated GEMV takes no argmax");
    ARC_REQUIRE_AS(who, !a.hand_out || (gated && !a.route && a.rows % 128 == 0 && a.rows <= GEMV_MAX_COLS),
                   "the handoff takes the output of a SwiGLU GEMV of a multiple of 128 rows, got %d", a.rows);
    ARC_REQUIRE_AS(who, !a.hand_in || (!gated && !a.route && !a.norm_w && a.cols % 128 == 0),
                   "the handoff feeds a GEMV without a norm of a multiple of 128 columns, got %d", a.cols);
    if (format_is_k(a.format)) return launch_qgemv_k(ctx, a, gated);
    if (format_codebook(a.format)) return launch_qgemv_codebook(ctx, a, gated);
    if (format_q5(a.format)) return launch_qgemv_q5(ctx, a, gated);
    if (format_two_bit(a.format)) return launch_qgemv_two_bit(ctx, a, gated);
    return launch_qgemv_q8_q4(ctx, a, gated);
}

extern "C" int arc_op_qgemv(arc_context *ctx, int32_t format, const void *w, const float *x, int32_t rows,
                            int32_t cols, const uint16_t *bias, const uint16_t *norm_weight, float eps,
                            int32_t accumulate, float *y) {
    return launch_qgemv(ctx, __func__,
                        QgemvArgs{format, (const uint8_t *)w, x, rows, cols, bias, norm_weight, eps, accumulate, y,
                                  nullptr},
                        false);
}

// The quantized lm_head of the greedy step (launch_gemv_argmax's twin): its argmax committed to
// to.loop, or with to.loop null written to *to.out and *to.value_out.
static int launch_qgemv_argmax(arc_context *ctx, const char *who, int32_t format, const void *w, const GemvIo &io,
                               const ArgmaxTo &to) {
    ARC_REQUIRE_AS(who, ctx, "ctx is null");
    ARC_REQUIRE_AS(who, to.loop != nullptr || to.out != nullptr, "null out");
    GemvArgmax am{ctx->head_argmax, to.loop != nullptr, to.loop ? commit_args(to.loop) : CommitArgs{}, to.out,
                  to.value_out};
    const int st = launch_qgemv(ctx, who,
                                QgemvArgs{format, (const uint8_t *)w, io.x, io.rows, io.cols, nullptr, io.norm_weight,
                                          io.eps, 0, io.y, &am, io.norm_add},
                                false);
    if (st == ARC_OK && to.loop && ctx->capturing) ctx->capture_commits = to.loop;
    return st;
}

extern "C" int arc_op_qgemv_argmax(arc_context *ctx, int32_t format, const void *w, const float *x, int32_t rows,
                                   int32_t cols, const uint16_t *norm_weight, float eps, float *y, int32_t *out,
                                   float *value_out) {
    return launch_qgemv_argmax(ctx, __func__, format, w,
                               {.x = x, .rows = rows, .cols = cols, .norm_weight = norm_weight, .eps = eps, .y = y},
                               {.out = out, .value_out = value_out});
}

// arc_op_qgemv_swiglu under any arc_activation, io.act (the gated GEMV's accumulate slot carries it).
static int qgemv_glu(arc_context *ctx, const char *who, int32_t format, const void *w_gate_up, const GemvIo &io) {
    return launch_qgemv(ctx, who,
                        QgemvArgs{format, (const uint8_t *)w_gate_up, io.x, io.rows, io.cols, nullptr, io.norm_weight,
                                  io.eps, io.act, io.y, nullptr, io.norm_add},
                        true);
}

extern "C" int arc_op_qgemv_swiglu(arc_context *ctx, int32_t format, const void *w_gate_up, const float *x,
                                   int32_t rows, int32_t cols, const uint16_t *norm_weight, float eps, float *y) {
    return qgemv_glu(ctx, __func__, format, w_gate_up,
                     {.x = x, .rows = rows, .cols = cols, .norm_weight = norm_weight, .eps = eps, .act = ARC_ACT_SILU,
                      .y = y});
}

// out[rows, cols] = bf16 of W's weights; thread t of the grid-stride loop decodes unit t % units
// of row t / units. Weights are read once, with no dependence on earlier kernels of the step.
template <int F>
__global__ void __launch_bounds__(DEQUANT_THREADS)
dequant_kernel(const uint8_t *__restrict__ w, int rows, int cols, uint16_t *__restrict__ out) {
    pdl_launch_dependents();
    pdl_wait();  // out may still be read by the product before
    const int units = cols / QUNIT;
    const RowLayout L = row_layout(F, cols);
    const long long total = (long long)rows * units;
    for (long long t = blockIdx.x * (long long)DEQUANT_THREADS + threadIdx.x; t < total;
         t += (long long)gridDim.x * DEQUANT_THREADS) {
        const int row = (int)(t / units), u = (int)(t % units);
        UnitRaw raw;
        load_unit<F>(w + (size_t)row * L.bytes, L, u, raw);
        float v[QUNIT];
        decode_unit<F>(raw, u, v);
        uint4 *dst = reinterpret_cast<uint4 *>(out + (size_t)row * cols + (size_t)u * QUNIT);
#pragma unroll
        for (int k = 0; k < QUNIT / 8; ++k)
            dst[k] = make_uint4(pack_bf16x2(v[8 * k], v[8 * k + 1]), pack_bf16x2(v[8 * k + 2], v[8 * k + 3]),
                                pack_bf16x2(v[8 * k + 4], v[8 * k + 5]), pack_bf16x2(v[8 * k + 6], v[8 * k + 7]));
    }
}

template <int F>
static int launch_dequant(arc_context *ctx, const uint8_t *w, int rows, int cols, uint16_t *out) {
    const long long total = (long long)rows * (cols / QUNIT);
    const long long most = (long long)ctx->sm_count * 8;
    const long long needed = (total + DEQUANT_THREADS - 1) / DEQUANT_THREADS;
    return arc_launch_pdl(ctx, "dequant_kernel", dequant_kernel<F>, dim3((unsigned)(needed < most ? needed : most)),
                          dim3(DEQUANT_THREADS), 0, w, rows, cols, out);
}

extern "C" int arc_op_dequantize(arc_context *ctx, int32_t format, const void *w, int32_t rows, int32_t cols,
                                 uint16_t *out) {
    ARC_REQUIRE(ctx && w && out, "null argument");
    ARC_TRY(check_format_shape(__func__, format, cols));
    ARC_REQUIRE(rows > 0, "rows must be positive, got %d", rows);
    ARC_REQUIRE((uintptr_t)w % 16 == 0 && (uintptr_t)out % 16 == 0, "w and out must be 16-byte aligned");
    const uint8_t *wb = (const uint8_t *)w;
    switch (format) {
    case ARC_FORMAT_Q8_0: return launch_dequant<ARC_FORMAT_Q8_0>(ctx, wb, rows, cols, out);
    case ARC_FORMAT_Q4_0: return launch_dequant<ARC_FORMAT_Q4_0>(ctx, wb, rows, cols, out);
    case ARC_FORMAT_Q4_1: return launch_dequant<ARC_FORMAT_Q4_1>(ctx, wb, rows, cols, out);
    case ARC_FORMAT_Q4_K: return launch_dequant<ARC_FORMAT_Q4_K>(ctx, wb, rows, cols, out);
    case ARC_FORMAT_Q5_K: return launch_dequant<ARC_FORMAT_Q5_K>(ctx, wb, rows, cols, out);
    case ARC_FORMAT_Q6_K: return launch_dequant<ARC_FORMAT_Q6_K>(ctx, wb, rows, cols, out);
    case ARC_FORMAT_MXFP4: return launch_dequant<ARC_FORMAT_MXFP4>(ctx, wb, rows, cols, out);
    case ARC_FORMAT_IQ4_NL: return launch_dequant<ARC_FORMAT_IQ4_NL>(ctx, wb, rows, cols, out);
    case ARC_FORMAT_IQ4_XS: return launch_dequant<ARC_FORMAT_IQ4_XS>(ctx, wb, rows, cols, out);
    case ARC_FORMAT_Q5_0: return launch_dequant<ARC_FORMAT_Q5_0>(ctx, wb, rows, cols, out);
    case ARC_FORMAT_Q5_1: return launch_dequant<ARC_FORMAT_Q5_1>(ctx, wb, rows, cols, out);
    case ARC_FORMAT_Q3_K: return launch_dequant<ARC_FORMAT_Q3_K>(ctx, wb, rows, cols, out);
    default: return launch_dequant<ARC_FORMAT_Q2_K>(ctx, wb, rows, cols, out);
    }
}

// ---- The forward's products over a Weight of any format ----------------------------------

int gemv_weight(arc_context *ctx, Weight w, const GemvIo &io, bool handed) {
    if (w.format == ARC_FORMAT_BF16) return launch_gemv_rows(ctx, "arc_op_gemv", (const uint16_t *)w.p, io);
    QgemvArgs a{w.format, (const uint8_t *)w.p, io.x, io.rows, io.cols, io.bias,
                io.norm_weight, io.eps, io.accumulate, io.y, nullptr, io.norm_add};
    a.hand_in = handed;
    return launch_qgemv(ctx, "arc_op_qgemv", a, false);
}

int gemv_swiglu_weight(arc_context *ctx, Weight w, const GemvIo &io, bool hand) {
    if (w.format == ARC_FORMAT_BF16) return gemv_glu(ctx, "gemv_swiglu_weight", (const uint16_t *)w.p, io);
    if (!hand) return qgemv_glu(ctx, "gemv_swiglu_weight", w.format, w.p, io);
    QgemvArgs a{w.format, (const uint8_t *)w.p, io.x, io.rows, io.cols, nullptr,
                io.norm_weight, io.eps, io.act, io.y, nullptr, io.norm_add};
    a.hand_out = true;
    return launch_qgemv(ctx, "gemv_swiglu_weight", a, true);
}

// The handoff costs the SwiGLU GEMV a fence and a ticket a task, and saves the down GEMV the
// staging of ffn_dim values: measured on the H200 (docs/PERF.md), a gain at 14,336 (llama8B:
// -1.9% a token) and a loss at 8,192 (llama1B: +1.6%); taken from 12,288 up.
enum { FFN_HANDOFF_MIN = 12288 };

bool ffn_handoff(Weight gate_up, Weight down, int32_t ffn_dim) {
    return format_quantized(gate_up.format) && format_quantized(down.format) && ffn_dim % 128 == 0 &&
           ffn_dim >= FFN_HANDOFF_MIN && ffn_dim <= GEMV_MAX_COLS;
}

extern "C" int arc_op_qgemv_ffn(arc_context *ctx, int32_t gate_up_format, const void *w_gate_up,
                                int32_t down_format, const void *w_down, const float *x, int32_t dim,
                                int32_t ffn_dim, const uint16_t *norm_weight, float eps, float *h, float *y) {
    // Every limit of both products checked before either runs, so that a refused call writes nothing.
    ARC_REQUIRE(ctx, "ctx is null");
    ARC_TRY(check_format_shape(__func__, gate_up_format, dim));
    ARC_TRY(check_format_shape(__func__, down_format, ffn_dim));
    ARC_TRY(check_gemv_io(__func__, w_gate_up, x, ffn_dim, dim, norm_weight, eps, h));
    ARC_TRY(check_gemv_io(__func__, w_down, h, dim, ffn_dim, nullptr, 0.0f, y));
    ARC_REQUIRE(ffn_dim <= INT32_MAX / 2, "ffn_dim %d too large", ffn_dim);
    ARC_REQUIRE((const void *)x != (const void *)y, "y must not alias x");
    const Weight gate_up{w_gate_up, gate_up_format}, down{w_down, down_format};
    const bool hand = ffn_handoff(gate_up, down, ffn_dim);
    ARC_TRY(gemv_swiglu_weight(ctx, gate_up,
                               {.x = x, .rows = ffn_dim, .cols = dim, .norm_weight = norm_weight, .eps = eps,
                                .act = ARC_ACT_SILU, .y = h},
                               hand));
    return gemv_weight(ctx, down, {.x = h, .rows = dim, .cols = ffn_dim, .accumulate = 1, .y = y}, hand);
}

int gemv_routed_weight(arc_context *ctx, Weight w, const GemvIo &io, bool gated, const GemvRoute &rt) {
    if (w.format == ARC_FORMAT_BF16)
        return launch_gemv_routed(ctx, "gemv_routed_weight", (const uint16_t *)w.p, io, gated, rt);
    return launch_qgemv(ctx, "gemv_routed_weight",
                        QgemvArgs{w.format, (const uint8_t *)w.p, io.x, io.rows, io.cols, io.bias, io.norm_weight,
                                  io.eps, gated ? io.act : io.accumulate, io.y, nullptr, io.norm_add, &rt},
                        gated);
}

int gemv_argmax_weight(arc_context *ctx, const char *who, Weight w, const GemvIo &io, arc_loop *loop) {
    if (w.format == ARC_FORMAT_BF16) return launch_gemv_argmax(ctx, who, (const uint16_t *)w.p, io, {.loop = loop});
    return launch_qgemv_argmax(ctx, who, w.format, w.p, io, {.loop = loop});
}

int gemv_parts(arc_context *ctx, const InParts &in, const uint16_t *bias, const GemvIo &io) {
    return part_runs(in, [&](Weight w, int32_t n, int32_t at) {
        return gemv_weight(ctx, w,
                           {.x = io.x, .rows = n, .cols = io.cols, .bias = bias ? bias + at : nullptr,
                            .norm_weight = io.norm_weight, .eps = io.eps, .norm_add = io.norm_add, .y = io.y + at});
    });
}
