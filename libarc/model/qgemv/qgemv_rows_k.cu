// qgemv_rows_k.cu -- the quantized rows GEMV's instances for Q4_K, Q5_K and Q6_K (qgemv_rows.cuh).
#include "qgemv_rows.cuh"

int launch_qrows_k(arc_context *ctx, int format, bool gated, const GemvPlan &plan, const QrowsArgs &a) {
    switch (format) {
    case ARC_FORMAT_Q4_K:
        return gated ? launch_qrows_format<ARC_FORMAT_Q4_K, true>(ctx, plan, a)
                     : launch_qrows_format<ARC_FORMAT_Q4_K, false>(ctx, plan, a);
    case ARC_FORMAT_Q5_K:
        return gated ? launch_qrows_format<ARC_FORMAT_Q5_K, true>(ctx, plan, a)
                     : launch_qrows_format<ARC_FORMAT_Q5_K, false>(ctx, plan, a);
    default:
        return gated ? launch_qrows_format<ARC_FORMAT_Q6_K, true>(ctx, plan, a)
                     : launch_qrows_format<ARC_FORMAT_Q6_K, false>(ctx, plan, a);
    }
}
