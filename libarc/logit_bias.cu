// logit_bias.cu -- a request's logit bias on the device: the pairs (id, value) the loop holds
// (DeviceState, written in stream order), added to the logits between a forward and its sampler.
#include <math.h>

#include "device_math.cuh"
#include "internal.cuh"
#include "launch.cuh"

enum { BIAS_THREADS = 256 };

struct BiasPairs {
    int32_t n;
    int32_t ids[ARC_MAX_LOGIT_BIAS];
    float values[ARC_MAX_LOGIT_BIAS];
};

__global__ void set_logit_bias_kernel(DeviceState *st, BiasPairs p) {
    st->n_bias = p.n;
    for (int k = 0; k < p.n; ++k) {
        st->bias_ids[k] = p.ids[k];
        st->bias_values[k] = p.values[k];
    }
}

__global__ void __launch_bounds__(BIAS_THREADS) logit_bias_kernel(const DeviceState *st, float *logits) {
    pdl_wait();  // the logits come from the forward before
    const int n = st->n_bias;
    for (int k = threadIdx.x; k < n; k += BIAS_THREADS) logits[st->bias_ids[k]] += st->bias_values[k];
}

// The sequence's logit bias (arc_loop_begin_sequence, ARC_SEQ_LOGIT_BIAS).
int loop_set_logit_bias(arc_loop *loop, const int32_t *ids, const float *values, int32_t n) {
    ARC_REQUIRE(n >= 0 && n <= ARC_MAX_LOGIT_BIAS, "at most %d logit bias pairs, got %d", ARC_MAX_LOGIT_BIAS, n);
    ARC_REQUIRE(n == 0 || (ids && values), "null argument");
    BiasPairs p = {};
    p.n = n;
    for (int k = 0; k < n; ++k) {
        ARC_REQUIRE(ids[k] >= 0 && ids[k] < loop->vocab, "logit bias id %d is outside [0, %d)", ids[k], loop->vocab);
        ARC_REQUIRE(isfinite(values[k]), "logit bias of id %d is not finite", ids[k]);
        for (int j = 0; j < k; ++j) ARC_REQUIRE(ids[j] != ids[k], "logit bias id %d is given twice", ids[k]);
        p.ids[k] = ids[k];
        p.values[k] = values[k];
    }
    arc_context *ctx = loop->ctx;
    set_logit_bias_kernel<<<1, 1, 0, ctx->stream>>>(loop->state, p);
    ARC_LAUNCHED(ctx, "set_logit_bias_kernel");
    return ARC_OK;
}

extern "C" int arc_loop_enqueue_logit_bias(arc_loop *loop, float *logits, int32_t width) {
    ARC_REQUIRE(loop && logits, "null argument");
    ARC_REQUIRE(loop->vocab <= width, "loop vocab %d exceeds the logits' width %d", loop->vocab, width);
    return arc_launch_pdl(loop->ctx, "logit_bias_kernel", logit_bias_kernel, dim3(1), dim3(BIAS_THREADS), 0,
                          (const DeviceState *)loop->state, logits);
}
