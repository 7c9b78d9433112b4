// qgemv_codebook.cu -- the quantized GEMV's instances for the codebook formats MXFP4, IQ4_NL and
// IQ4_XS (qgemv.cuh).
#include "qgemv.cuh"

int launch_qgemv_codebook(arc_context *ctx, const QgemvArgs &a, bool gated) {
    switch (a.format) {
    case ARC_FORMAT_MXFP4:
        return gated ? launch_qgemv_format<ARC_FORMAT_MXFP4, true>(ctx, a)
                     : launch_qgemv_format<ARC_FORMAT_MXFP4, false>(ctx, a);
    case ARC_FORMAT_IQ4_NL:
        return gated ? launch_qgemv_format<ARC_FORMAT_IQ4_NL, true>(ctx, a)
                     : launch_qgemv_format<ARC_FORMAT_IQ4_NL, false>(ctx, a);
    default:
        return gated ? launch_qgemv_format<ARC_FORMAT_IQ4_XS, true>(ctx, a)
                     : launch_qgemv_format<ARC_FORMAT_IQ4_XS, false>(ctx, a);
    }
}
