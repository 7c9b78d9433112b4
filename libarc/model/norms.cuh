// norms.cuh -- the norms of the layer program that no product fuses (norms.cu).
#pragma once

#include "internal.cuh"
#include "model/parts.cuh"

// The per-head norm of q and k (ARC_OP_QK_NORM) over rows of qkv, `stride` floats apart.
struct HeadNormArgs {
    float *qkv = nullptr;
    int32_t rows = 0, stride = 0;
    int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
    const uint16_t *q_norm = nullptr, *k_norm = nullptr;
    float eps = 0.0f;
    float norm_add = 0.0f;  // norm_offset
    bool v_norm = false;  // the v heads normed too, without weights (Gemma 4)
};

// Each q and k head of a.qkv (rows, stride) float32, in place: head * rsqrt(mean(head^2) + eps) *
// (norm_add + w), w = q_norm for the n_heads q heads, k_norm for the n_kv_heads k heads; with v_norm
// the v heads' too, by weights of 1.
int launch_head_norm(arc_context *ctx, const HeadNormArgs &a);
// x[r] += rmsnorm(t[r]) under norm for rows r of dim floats: a product's output normed before the
// residual add (ARC_OP_ATTN_OUT_NORM, ARC_OP_FFN_OUT_NORM).
int launch_add_norm_rows(arc_context *ctx, float *x, const float *t, int32_t rows, int32_t dim, const RmsNorm &norm);
// The norms of a layer with the experts beside its FFN (ARC_OP_EXPERTS_BESIDE): the dense FFN's
// output's, the experts' and their sum's (one eps and offset for the three).
struct NormPair {
    RmsNorm a, b, out;
};
// x[r] += rmsnorm(rmsnorm(a[r], n.a) + rmsnorm(b[r], n.b), n.out) for rows r of dim floats.
int launch_add_norm_pair_rows(arc_context *ctx, float *x, const float *a, const float *b, int32_t rows, int32_t dim,
                              const NormPair &n);

// QK_NORM's arguments for layer lw of a model of config c over `rows` rows of qkv, each the layer's
// qkv_rows floats apart: its dims, its norms, and the v heads' with v_norm.
inline HeadNormArgs head_norm_args(const arc_model_config &c, const LayerParts &lw, float *qkv, int32_t rows) {
    return {.qkv = qkv, .rows = rows, .stride = lw.dims.qkv_rows, .n_heads = c.n_heads,
            .n_kv_heads = lw.shared ? 0 : lw.dims.n_kv,  // a shared layer's rows hold q alone
            .head_dim = lw.dims.hd, .q_norm = lw.q_norm, .k_norm = lw.k_norm, .eps = c.rms_eps,
            .norm_add = norm_offset(c), .v_norm = c.v_norm != 0};
}
