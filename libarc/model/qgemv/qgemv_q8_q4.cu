// qgemv_q8_q4.cu -- the quantized GEMV's instances for Q8_0, Q4_0 and Q4_1 (qgemv.cuh).
#include "qgemv.cuh"

int launch_qgemv_q8_q4(arc_context *ctx, const QgemvArgs &a, bool gated) {
    switch (a.format) {
    case ARC_FORMAT_Q8_0:
        return gated ? launch_qgemv_format<ARC_FORMAT_Q8_0, true>(ctx, a)
                     : launch_qgemv_format<ARC_FORMAT_Q8_0, false>(ctx, a);
    case ARC_FORMAT_Q4_0:
        return gated ? launch_qgemv_format<ARC_FORMAT_Q4_0, true>(ctx, a)
                     : launch_qgemv_format<ARC_FORMAT_Q4_0, false>(ctx, a);
    default:
        return gated ? launch_qgemv_format<ARC_FORMAT_Q4_1, true>(ctx, a)
                     : launch_qgemv_format<ARC_FORMAT_Q4_1, false>(ctx, a);
    }
}
