// qgemv_rows_q5.cu -- the quantized rows GEMV's instances for Q5_0 and Q5_1 (qgemv_rows.cuh).
#include "qgemv_rows.cuh"

int launch_qrows_q5(arc_context *ctx, int format, bool gated, const GemvPlan &plan, const QrowsArgs &a) {
    if (format == ARC_FORMAT_Q5_0)
        return gated ? launch_qrows_format<ARC_FORMAT_Q5_0, true>(ctx, plan, a)
                     : launch_qrows_format<ARC_FORMAT_Q5_0, false>(ctx, plan, a);
    return gated ? launch_qrows_format<ARC_FORMAT_Q5_1, true>(ctx, plan, a)
                 : launch_qrows_format<ARC_FORMAT_Q5_1, false>(ctx, plan, a);
}
