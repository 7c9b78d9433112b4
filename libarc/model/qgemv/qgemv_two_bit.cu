// qgemv_two_bit.cu -- the quantized GEMV's instances for the 2-bit formats Q3_K and Q2_K (qgemv.cuh).
#include "qgemv.cuh"

int launch_qgemv_two_bit(arc_context *ctx, const QgemvArgs &a, bool gated) {
    if (a.format == ARC_FORMAT_Q3_K)
        return gated ? launch_qgemv_format<ARC_FORMAT_Q3_K, true>(ctx, a)
                     : launch_qgemv_format<ARC_FORMAT_Q3_K, false>(ctx, a);
    return gated ? launch_qgemv_format<ARC_FORMAT_Q2_K, true>(ctx, a)
                 : launch_qgemv_format<ARC_FORMAT_Q2_K, false>(ctx, a);
}
