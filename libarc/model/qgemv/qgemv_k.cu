// qgemv_k.cu -- the quantized GEMV's instances for the _K formats Q4_K, Q5_K and Q6_K (qgemv.cuh).
#include "qgemv.cuh"

int launch_qgemv_k(arc_context *ctx, const QgemvArgs &a, bool gated) {
    switch (a.format) {
    case ARC_FORMAT_Q4_K:
        return gated ? launch_qgemv_format<ARC_FORMAT_Q4_K, true>(ctx, a)
                     : launch_qgemv_format<ARC_FORMAT_Q4_K, false>(ctx, a);
    case ARC_FORMAT_Q5_K:
        return gated ? launch_qgemv_format<ARC_FORMAT_Q5_K, true>(ctx, a)
                     : launch_qgemv_format<ARC_FORMAT_Q5_K, false>(ctx, a);
    default:
        return gated ? launch_qgemv_format<ARC_FORMAT_Q6_K, true>(ctx, a)
                     : launch_qgemv_format<ARC_FORMAT_Q6_K, false>(ctx, a);
    }
}
