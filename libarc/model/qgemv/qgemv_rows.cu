// qgemv_rows.cu -- the entry points of the quantized GEMV over rows (qgemv_rows.cuh): each row
// staged as the one-row GEMV stages its input, then the product over the staged rows, and the
// verify's product over a Weight of any format (gemv_rows_weight).
#include "model/products.cuh"
#include "qgemv_rows.cuh"

// Row blockIdx.x of x (cols floats) normed (norm_w non-null) and quantized into its staged row of
// xq (qrow_stride apart), by the one-row GEMV's own staging: the same bits, unit by unit.
__global__ void __launch_bounds__(GEMV_THREADS)
qstage_rows_kernel(const float *__restrict__ x, int cols, const uint16_t *__restrict__ norm_w, float eps, float add,
                   uint8_t *__restrict__ xq) {
    __shared__ float red[GEMV_WARPS];
    pdl_launch_dependents();
    pdl_wait();
    const int units = cols / QUNIT;
    uint8_t *row = xq + blockIdx.x * qrow_stride(units);
    stage_input(x + (size_t)blockIdx.x * cols, cols, norm_w, eps, add, nullptr, reinterpret_cast<int4 *>(row),
                reinterpret_cast<float *>(row + 40 * (size_t)units), reinterpret_cast<int2 *>(row + 32 * (size_t)units),
                red);
}

// y (m rows, ldy apart) = W @ n(x[i]) (+ bias) (+ y), or gated act(gate) * up (the kernel's
// accumulate slot carries io.act); io.scratch holds the staged rows (m * qrow_stride bytes, within
// m * cols floats). Rows that do not fit the shared memory together run in more launches, each
// reading the weights again.
static int qgemv_rows(arc_context *ctx, const char *who, int32_t format, const void *w, const GemvIo &io, bool gated) {
    const int32_t m = io.m, rows = io.rows, cols = io.cols, ldy = io.ldy;
    const void *scratch = io.scratch;
    ARC_REQUIRE_AS(who, ctx, "ctx is null");
    ARC_TRY(check_format_shape(who, format, cols));
    ARC_TRY(check_gemv_io(who, w, io.x, rows, cols, io.norm_weight, io.eps, io.y));
    ARC_REQUIRE_AS(who, m >= 1 && m <= QROWS_MAX, "m must be in 1..%d, got %d", QROWS_MAX, m);
    ARC_REQUIRE_AS(who, ldy >= rows, "the output rows' stride %d is below rows %d", ldy, rows);
    ARC_REQUIRE_AS(who, !gated || rows <= INT32_MAX / 2, "rows %d too large", rows);
    ARC_REQUIRE_AS(who,
                   scratch && (uintptr_t)scratch % 16 == 0 && scratch != (void *)io.y && scratch != (const void *)io.x,
                   "the quantized rows need scratch: 16-byte aligned, m x cols floats, neither x nor y");
    if (gated)
        ARC_REQUIRE_AS(who, io.act >= ARC_ACT_SILU && io.act <= ARC_ACT_SWIGLU_LIMIT, "unknown activation %d", io.act);
    const int units = cols / QUNIT;
    const size_t stride = qrow_stride(units);
    uint8_t *xq = (uint8_t *)io.scratch;
    ARC_TRY(arc_launch_pdl(ctx, "qstage_rows_kernel", qstage_rows_kernel, dim3(m), dim3(GEMV_THREADS), 0, io.x,
                           (int)cols, io.norm_weight, io.eps, io.norm_add, xq));
    const GemvPlan plan = qgemv_plan(ctx, format, rows, cols, gated);
    const int per = (int)(QROWS_SMEM / stride);  // >= 2: cols <= GEMV_MAX_COLS
    for (int i0 = 0; i0 < m; i0 += per) {
        const QrowsArgs a{(const uint8_t *)w, xq + i0 * stride, m - i0 < per ? m - i0 : per, rows, cols, io.bias,
                          gated ? io.act : io.accumulate, io.y + (size_t)i0 * ldy, ldy};
        ARC_TRY(format_is_k(format)        ? launch_qrows_k(ctx, format, gated, plan, a)
                : format_codebook(format) ? launch_qrows_codebook(ctx, format, gated, plan, a)
                : format_q5(format)       ? launch_qrows_q5(ctx, format, gated, plan, a)
                : format_two_bit(format)  ? launch_qrows_two_bit(ctx, format, gated, plan, a)
                                          : launch_qrows_q8_q4(ctx, format, gated, plan, a));
    }
    return ARC_OK;
}

int gemv_rows_weight(arc_context *ctx, const char *who, Weight w, const GemvIo &io, bool gated) {
    if (w.format == ARC_FORMAT_BF16) return gemv_rows(ctx, who, (const uint16_t *)w.p, io, gated);
    return qgemv_rows(ctx, who, w.format, w.p, io, gated);
}

extern "C" int arc_op_qgemv_rows(arc_context *ctx, int32_t format, const void *w, const float *x, int32_t m,
                                 int32_t rows, int32_t cols, const uint16_t *bias, const uint16_t *norm_weight,
                                 float eps, int32_t accumulate, float *scratch, float *y) {
    ARC_REQUIRE(accumulate == 0 || accumulate == 1, "accumulate must be 0 or 1, got %d", accumulate);
    return qgemv_rows(ctx, __func__, format, w,
                      {.x = x, .m = m, .rows = rows, .cols = cols, .bias = bias, .norm_weight = norm_weight,
                       .eps = eps, .accumulate = accumulate, .scratch = scratch, .y = y, .ldy = rows},
                      /*gated=*/false);
}

extern "C" int arc_op_qgemv_rows_swiglu(arc_context *ctx, int32_t format, const void *w_gate_up, const float *x,
                                        int32_t m, int32_t rows, int32_t cols, const uint16_t *norm_weight, float eps,
                                        float *scratch, float *y) {
    return qgemv_rows(ctx, __func__, format, w_gate_up,
                      {.x = x, .m = m, .rows = rows, .cols = cols, .norm_weight = norm_weight, .eps = eps,
                       .act = ARC_ACT_SILU, .scratch = scratch, .y = y, .ldy = rows},
                      /*gated=*/true);
}
