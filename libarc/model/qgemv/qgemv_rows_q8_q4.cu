// qgemv_rows_q8_q4.cu -- the quantized rows GEMV's instances for Q8_0, Q4_0 and Q4_1 (qgemv_rows.cuh).
#include "qgemv_rows.cuh"

int launch_qrows_q8_q4(arc_context *ctx, int format, bool gated, const GemvPlan &plan, const QrowsArgs &a) {
    switch (format) {
    case ARC_FORMAT_Q8_0:
        return gated ? launch_qrows_format<ARC_FORMAT_Q8_0, true>(ctx, plan, a)
                     : launch_qrows_format<ARC_FORMAT_Q8_0, false>(ctx, plan, a);
    case ARC_FORMAT_Q4_0:
        return gated ? launch_qrows_format<ARC_FORMAT_Q4_0, true>(ctx, plan, a)
                     : launch_qrows_format<ARC_FORMAT_Q4_0, false>(ctx, plan, a);
    default:
        return gated ? launch_qrows_format<ARC_FORMAT_Q4_1, true>(ctx, plan, a)
                     : launch_qrows_format<ARC_FORMAT_Q4_1, false>(ctx, plan, a);
    }
}
