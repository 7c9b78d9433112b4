// deltanet_math.cuh -- the arithmetic of one DeltaNet row, written once for every form of the step
// (the decode's and the verify's deltanet_kernel in deltanet.cu, the prefill's kernels in
// deltanet_rows.cu), so that a row gets the same bits whichever form runs it:
//   - the convolution's taps in order, the oldest input first, then SiLU;
//   - a head's sum of squares over its 128 elements as four warps hold them (element e in warp e / 32,
//     lane e % 32): each warp's butterfly sum, then the four added in pairs; the squares rounded before
//     they are summed (no multiply folded into an add);
//   - S's products over k: a thread holds S[k][j] for the 32 k of its group g (k = 32 g + i), sums
//     its part over them in four interleaved chains added in pairs, and the four groups' parts are
//     added in pairs: (p0 + p1) + (p2 + p3).
#pragma once

#include "deltanet.cuh"
#include "device_math.cuh"

enum { DN_GROUPS = 4, DN_PER = DN_HEAD_DIM / DN_GROUPS };

// What a launch of the step takes (deltanet_kernel in deltanet.cu, dn_cluster_kernel in
// deltanet_cluster.cu): DeltaNetIo's rows and the layer's weights and slots.
struct DnArgs {
    const float *u;
    int32_t u_stride, rows;
    const int32_t *pos;
    int32_t pos_add, every_state, early;
    const uint16_t *conv_w, *a_log, *dt_bias, *norm;
    float *state;
    uint64_t slot_floats;
    int32_t v_heads, group, k_dim, v_dim, conv_dim;
    float eps;
    float *out;
    uint16_t *out_bf16;
};
// The step in clusters of four blocks a head (deltanet_cluster.cu; compute capability 9.0 or more).
int deltanet_cluster(arc_context *ctx, int conv_kernel, const DnArgs &a);
constexpr float DN_Q_SCALE = 0.08838834764831845f;  // 1 / sqrt(128): q's factor after its norm

__device__ __forceinline__ float dn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// log(1 + exp(x)), x itself above 20.
__device__ __forceinline__ float dn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// One channel's convolution output: w the channel's K taps, hist its K - 1 inputs before `now`.
template <int K>
__device__ __forceinline__ float dn_conv(const float (&w)[K], const float (&hist)[K - 1], float now) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < K - 1; ++i) acc = fmaf(w[i], hist[i], acc);
    return silu(fmaf(w[K - 1], now, acc));
}

// The inputs a channel keeps after `now`: the oldest dropped.
template <int K>
__device__ __forceinline__ void dn_push(float (&hist)[K - 1], float now) {
#pragma unroll
    for (int i = 0; i + 1 < K - 1; ++i) hist[i] = hist[i + 1];
    hist[K - 2] = now;
}

__device__ __forceinline__ float dn_square(float x) { return __fmul_rn(x, x); }
__device__ __forceinline__ float dn_sum4(const float *p) { return (p[0] + p[1]) + (p[2] + p[3]); }
// q or k normalized by its head's sum of squares ss (q: times DN_Q_SCALE, k: times 1).
__device__ __forceinline__ float dn_unit(float x, float ss, float scale) { return x / sqrtf(ss + 1e-6f) * scale; }

// beta = sigmoid(b); the decay exp(-exp(A_log) softplus(a + dt_bias)).
__device__ __forceinline__ float dn_beta(float b) { return dn_sigmoid(b); }
__device__ __forceinline__ float dn_decay(float a, uint16_t a_log, uint16_t dt_bias) {
    const float rate = -expf(bf16_to_f32(a_log));
    return expf(rate * dn_softplus(a + bf16_to_f32(dt_bias)));
}

// A thread's part of sum_k S[k][j] x[k] over its DN_PER k.
__device__ __forceinline__ float dn_dot(const float (&s)[DN_PER], const float *x) {
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < DN_PER; ++i) c[i % 4] = fmaf(s[i], x[i], c[i % 4]);
    return (c[0] + c[1]) + (c[2] + c[3]);
}

// One row through a thread's part of S: S <- decay S; kv_j = sum_k S[k][j] k_k; delta = beta (v_j - kv_j);
// S[k][j] += k_k delta; returns o_j = sum_k S[k][j] q_k. k and q: the row's at the thread's DN_PER k;
// combine(part) returns the four groups' parts added in pairs.
template <class Combine>
__device__ __forceinline__ float dn_update(float (&s)[DN_PER], const float *k, const float *q, float v, float beta,
                                           float decay, Combine combine) {
#pragma unroll
    for (int i = 0; i < DN_PER; ++i) s[i] *= decay;
    const float delta = beta * (v - combine(dn_dot(s, k)));
#pragma unroll
    for (int i = 0; i < DN_PER; ++i) s[i] = fmaf(k[i], delta, s[i]);
    return combine(dn_dot(s, q));
}

// The gated norm of one output: o rsqrt(mean(o^2) + eps) w silu(z), ss the head's sum of squares.
__device__ __forceinline__ float dn_gated_norm(float o, float ss, float eps, float w, float z) {
    return o * rsqrtf(ss / (float)DN_HEAD_DIM + eps) * w * silu(z);
}
