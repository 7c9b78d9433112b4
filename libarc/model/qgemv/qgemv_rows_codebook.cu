// qgemv_rows_codebook.cu -- the quantized rows GEMV's instances for MXFP4, IQ4_NL and IQ4_XS
// (qgemv_rows.cuh).
#include "qgemv_rows.cuh"

int launch_qrows_codebook(arc_context *ctx, int format, bool gated, const GemvPlan &plan, const QrowsArgs &a) {
    switch (format) {
    case ARC_FORMAT_MXFP4:
        return gated ? launch_qrows_format<ARC_FORMAT_MXFP4, true>(ctx, plan, a)
                     : launch_qrows_format<ARC_FORMAT_MXFP4, false>(ctx, plan, a);
    case ARC_FORMAT_IQ4_NL:
        return gated ? launch_qrows_format<ARC_FORMAT_IQ4_NL, true>(ctx, plan, a)
                     : launch_qrows_format<ARC_FORMAT_IQ4_NL, false>(ctx, plan, a);
    default:
        return gated ? launch_qrows_format<ARC_FORMAT_IQ4_XS, true>(ctx, plan, a)
                     : launch_qrows_format<ARC_FORMAT_IQ4_XS, false>(ctx, plan, a);
    }
}
