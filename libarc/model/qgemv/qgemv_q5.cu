// qgemv_q5.cu -- the quantized GEMV's instances for Q5_0 and Q5_1 (qgemv.cuh).
#include "qgemv.cuh"

int launch_qgemv_q5(arc_context *ctx, const QgemvArgs &a, bool gated) {
    if (a.format == ARC_FORMAT_Q5_0)
        return gated ? launch_qgemv_format<ARC_FORMAT_Q5_0, true>(ctx, a)
                     : launch_qgemv_format<ARC_FORMAT_Q5_0, false>(ctx, a);
    return gated ? launch_qgemv_format<ARC_FORMAT_Q5_1, true>(ctx, a)
                 : launch_qgemv_format<ARC_FORMAT_Q5_1, false>(ctx, a);
}
