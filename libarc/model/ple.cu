// ple.cu -- Gemma 4's per-layer embeddings (ple.cuh): two row kernels the three forwards launch
// around their own products (forward.cu, speculate.cu, prefill.cu).
#include "ple.cuh"

#include <math.h>

#include "device_math.cuh"
#include "launch.cuh"
#include "model/buffers.cuh"
#include "model/norms.cuh"

enum { PLE_THREADS = 256 };

// Slice blockIdx.x of row blockIdx.y of ple (rows of `width` = n_layers * pd floats), in place:
// (x * inv * (add + w) + table[token] * row_scale) * sum_scale, x = the slice times proj_scale, inv
// its RMS norm's factor. Each thread reads and writes only its own elements after the sum.
__global__ void __launch_bounds__(PLE_THREADS)
ple_inputs_kernel(float *__restrict__ ple, const uint16_t *__restrict__ table, int ple_vocab,
                  const int32_t *__restrict__ tokens, int pd, int width, const uint16_t *__restrict__ w, float eps,
                  float add, float proj_scale, float row_scale, float sum_scale) {
    __shared__ float red[PLE_THREADS / 32];
    pdl_launch_dependents();
    pdl_wait();  // the projection's output, and the tokens
    const int l = blockIdx.x, r = blockIdx.y, tid = threadIdx.x;
    float *v = ple + (size_t)r * width + (size_t)l * pd;
    const int32_t tok = tokens[r];
    const bool bad = tok < 0 || tok >= ple_vocab;
    float ss = 0.0f;
    for (int i = tid; i < pd; i += PLE_THREADS) {
        const float x = v[i] * proj_scale;
        ss += x * x;
    }
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)pd + eps);
    const uint16_t *own = table + (size_t)(bad ? 0 : tok) * width + (size_t)l * pd;
    for (int i = tid; i < pd; i += PLE_THREADS) {
        const float x = v[i] * proj_scale;
        const float e = bad ? quiet_nan() : bf16_to_f32(own[i]) * row_scale;
        v[i] = (x * inv * (add + bf16_to_f32(w[i])) + e) * sum_scale;
    }
}

// Row blockIdx.y: g[i] = gelu_tanh(g[i]) * p[i], p the row's slice of `layer`; to gb as bf16 when
// gb is set.
__global__ void __launch_bounds__(PLE_THREADS)
ple_gate_kernel(float *__restrict__ g, const float *__restrict__ ple, int pd, int width, int layer,
                uint16_t *__restrict__ gb) {
    pdl_launch_dependents();
    pdl_wait();
    const int r = blockIdx.y;
    const float *p = ple + (size_t)r * width + (size_t)layer * pd;
    for (int i = blockIdx.x * PLE_THREADS + threadIdx.x; i < pd; i += gridDim.x * PLE_THREADS) {
        const float out = glu(g[(size_t)r * pd + i], p[i], ARC_ACT_GELU_TANH);
        if (gb)
            gb[(size_t)r * pd + i] = f32_to_bf16(out);
        else
            g[(size_t)r * pd + i] = out;
    }
}

int launch_ple_inputs(const ModelParts &p, float *ple, const int32_t *tokens, int32_t rows) {
    const arc_model_config &c = p.cfg;
    ARC_REQUIRE(ple && tokens && p.ple_embed && p.ple_norm && rows > 0, "null pointer or no rows");
    const int width = c.n_layers * c.ple_dim;
    return arc_launch_pdl(p.ctx, "ple_inputs_kernel", ple_inputs_kernel, dim3(c.n_layers, rows), dim3(PLE_THREADS), 0,
                          ple, p.ple_embed, (int)c.ple_vocab, tokens, (int)c.ple_dim, width, p.ple_norm, c.rms_eps,
                          norm_offset(c), (float)(1.0 / sqrt((double)c.dim)), (float)sqrt((double)c.ple_dim),
                          (float)(1.0 / sqrt(2.0)));
}

int launch_ple_gate(const ModelParts &p, float *g, const float *ple, int32_t rows, int32_t layer, uint16_t *gb) {
    const arc_model_config &c = p.cfg;
    ARC_REQUIRE(g && ple && rows > 0 && layer >= 0 && layer < c.n_layers, "null pointer, no rows or layer %d", layer);
    const unsigned blocks = (unsigned)((c.ple_dim + PLE_THREADS - 1) / PLE_THREADS);
    return arc_launch_pdl(p.ctx, "ple_gate_kernel", ple_gate_kernel, dim3(blocks, rows), dim3(PLE_THREADS), 0, g, ple,
                          (int)c.ple_dim, (int)(c.n_layers * c.ple_dim), (int)layer, gb);
}

// xn[r] = bf16(x[r]) (nearest even), rows of dim floats, one block a row.
__global__ void __launch_bounds__(PLE_THREADS)
round_rows_kernel(const float *__restrict__ x, int dim, uint16_t *__restrict__ xn) {
    pdl_launch_dependents();
    pdl_wait();
    const size_t r = blockIdx.x;
    for (int d = threadIdx.x; d < dim; d += PLE_THREADS) xn[r * dim + d] = f32_to_bf16(x[r * dim + d]);
}

static int round_rows(const ModelParts &p, int32_t n, uint16_t *xn) {
    return arc_launch_pdl(p.ctx, "round_rows_kernel", round_rows_kernel, dim3(n), dim3(PLE_THREADS), 0,
                          (const float *)p.prefill->x, (int)p.cfg.dim, xn);
}

int ple_prefill_inputs(const ModelParts &p, const int32_t *tokens, int32_t n) {
    const PrefillBuffers &b = *p.prefill;
    const arc_model_config &c = p.cfg;
    ARC_TRY(round_rows(p, n, b.xn));
    ARC_TRY(arc_op_gemm_bf16(p.ctx, b.xn, (const uint16_t *)p.ple_projection.p, n, c.n_layers * c.ple_dim, c.dim,
                             nullptr, 0, b.ple));
    return launch_ple_inputs(p, b.ple, tokens, n);
}

int ple_prefill_layer(const ModelParts &p, const LayerParts &lw, int32_t n) {
    const PrefillBuffers &b = *p.prefill;
    const arc_model_config &c = p.cfg;
    ARC_TRY(round_rows(p, n, b.xn));
    ARC_TRY(arc_op_gemm_bf16(p.ctx, b.xn, (const uint16_t *)lw.ple_gate.p, n, c.ple_dim, c.dim, nullptr, 0, b.pg));
    ARC_TRY(launch_ple_gate(p, b.pg, b.ple, n, lw.layer, b.pgb));
    ARC_TRY(arc_op_gemm_bf16(p.ctx, b.pgb, (const uint16_t *)lw.ple_out.p, n, c.dim, c.ple_dim, nullptr, 0, b.t));
    return launch_add_norm_rows(p.ctx, b.x, b.t, n, c.dim, model_norm(c, lw.ple_post_norm));
}
