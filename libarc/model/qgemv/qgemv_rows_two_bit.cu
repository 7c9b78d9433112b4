// qgemv_rows_two_bit.cu -- the quantized rows GEMV's instances for Q3_K and Q2_K (qgemv_rows.cuh).
#include "qgemv_rows.cuh"

int launch_qrows_two_bit(arc_context *ctx, int format, bool gated, const GemvPlan &plan, const QrowsArgs &a) {
    if (format == ARC_FORMAT_Q3_K)
        return gated ? launch_qrows_format<ARC_FORMAT_Q3_K, true>(ctx, plan, a)
                     : launch_qrows_format<ARC_FORMAT_Q3_K, false>(ctx, plan, a);
    return gated ? launch_qrows_format<ARC_FORMAT_Q2_K, true>(ctx, plan, a)
                 : launch_qrows_format<ARC_FORMAT_Q2_K, false>(ctx, plan, a);
}
