// prefill.cu -- the prompt in one forward per chunk: every token of a chunk goes through the
// whole model together, so each weight is read once per chunk instead of once per token, and the
// products run on tensor cores (gemm.cu) instead of the decode's GEMVs.
//
// Per chunk of c tokens: the embedding rows, then each layer's program (layer.cuh) as the prefill
// runs its ops:
//   ATTN_IN   rmsnorm_rows   xn = bf16(rmsnorm(x, attn_norm))                     (c, dim)
//             gemm           qkv = xn [Wq; Wk; Wv]^T (+ [bq; bk; bv])              (c, q_dim + 2 kv_dim) f32
//   QK_NORM   head_norm      each q and k head RMS-normed in place (norms.cu)
//   ATTEND    rope_kv        q, k rotated at their positions (the layer's RoPE); k, v -> cache
//                            rows; q -> bf16
//             flash_prefill  att = causal attention over the cache                 (c, q_dim) bf16
//   ATTN_OUT  gemm           x += att Wo^T
//   FFN_IN    rmsnorm_rows   xn = bf16(rmsnorm(x, mlp_norm))
//             gemm_swiglu    h = bf16(act(xn Wg^T) * (xn Wu^T))                    (c, the layer's ffn)
//                            (on an sm_90 GPU: the product in float32, then swiglu_rows; gemm.cu)
//   FFN_OUT   gemm           x += h Wdown^T
//   ATTN_OUT_NORM, FFN_OUT_NORM  the product to t (c, dim) f32, then add_norm_rows: x += rmsnorm(t)
//   MOE_IN    rmsnorm_rows, then a mixture of experts' router, routing, rows sorted by expert and
//             grouped products (moe.cu)
//   MOE_OUT   the experts' down products, summed into x by each row's weights (moe.cu)
//   EXPERTS_BESIDE  the dense FFN's down product to t; the router's rows normed by ROUTER_SCALE, the
//             experts' by MOE_NORM; the experts' products and sum, then add_norm_pair_rows (moe.cu)
//   PER_LAYER_INPUT the layer's per-layer input, the rows' inputs made after the embedding (ple.cu)
//   LAYER_SCALAR scale_rows  x *= the layer's scalar
//   DN_STEP   a DeltaNet layer's rows one after another through its state (deltanet.cu)
// (q_dim, kv_dim: the layer's own, layer_dims) and after the last chunk the decode's GEMV for the
// last position only: logits = lm_head @ rmsnorm(x, final_norm), soft-capped where the config caps
// them. To score a prompt, each row goes through that GEMV too, its logits ranked as the loop's
// log-probabilities are. The residual stream stays float32; a product's input is rounded to bf16.
// Like the forward, every kernel launches with programmatic dependence, nothing waits on the host.
// A quantized matrix is read packed by the products of a chunk of up to QUANT_DIRECT_ROWS tokens
// (gemm_quant.cu); for a longer chunk it is dequantized to bf16 into a scratch before its product.
// Both give the same bits, so a row's KV does not depend on the chunk it was prefilled in.
#include <math.h>

#include "layer.cuh"
#include "model/attention_ops.cuh"
#include "model/embedding.cuh"
#include "model/gemm/gemm.cuh"
#include "model/gemm/gemm_sm90.cuh"
#include "model/moe/moe.cuh"
#include "model/norms.cuh"
#include "model/ple.cuh"
#include "model/products.cuh"
#include "model/scales.cuh"
#include "model/tensor_core.cuh"

enum { ROWS_THREADS = 256, SCORE_ROWS = 128 };  // SCORE_ROWS: a prompt's rows ranked in one launch
// The most the gate/up product's float32 scratch takes on an sm_90 GPU (prefill_chunk).
constexpr uint64_t GU_BYTES = 128ull << 20;

// x[i] (dim) = float(table[tokens[i]]), one block per row i. An id outside [0, vocab) fills the
// row with NaN rather than read out of bounds. Limits: dim % 8 == 0, table and x 16-byte aligned.
__global__ void __launch_bounds__(ROWS_THREADS)
embed_rows_kernel(const uint16_t *__restrict__ table, int vocab, int dim, const int32_t *tokens, float scale,
                  float *__restrict__ x) {
    pdl_launch_dependents();
    pdl_wait();  // the tokens may come from an earlier kernel
    const int i = blockIdx.x;
    embed_row(table, vocab, dim, (uint32_t)tokens[i], scale, x + (size_t)i * dim, ROWS_THREADS);
}

// xn[i] = bf16(x[i] * rsqrt(mean(x[i]^2) + eps) * w), the decode GEMV's fused norm (same formula)
// rounded for the product that reads it; one block a row. Limits: dim % 8 == 0, x, w, xn 16-byte aligned.
__global__ void __launch_bounds__(ROWS_THREADS)
rmsnorm_rows_kernel(const float *__restrict__ x, const uint16_t *__restrict__ w, int dim, float eps, float add,
                    uint16_t *__restrict__ xn) {
    __shared__ float red[ROWS_THREADS / 32];
    pdl_launch_dependents();
    pdl_wait();
    const int i = blockIdx.x, nvec = dim / 8;
    const float4 *row = reinterpret_cast<const float4 *>(x + (size_t)i * dim);
    float ss = 0.0f;
    for (int v = threadIdx.x; v < nvec; v += ROWS_THREADS) ss = add_sq8(ss, row[2 * v], row[2 * v + 1]);
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)dim + eps);
    const uint4 *wv = reinterpret_cast<const uint4 *>(w);
    uint4 *out = reinterpret_cast<uint4 *>(xn + (size_t)i * dim);
    for (int v = threadIdx.x; v < nvec; v += ROWS_THREADS) {
        const float4 a = row[2 * v], b = row[2 * v + 1];
        const uint4 g = wv[v];
        out[v] = make_uint4(pack_bf16x2(a.x * inv * (add + bf16_lo(g.x)), a.y * inv * (add + bf16_hi(g.x))),
                            pack_bf16x2(a.z * inv * (add + bf16_lo(g.y)), a.w * inv * (add + bf16_hi(g.y))),
                            pack_bf16x2(b.x * inv * (add + bf16_lo(g.z)), b.y * inv * (add + bf16_hi(g.z))),
                            pack_bf16x2(b.z * inv * (add + bf16_lo(g.w)), b.w * inv * (add + bf16_hi(g.w))));
    }
}

void prefill_buffers_release(PrefillBuffers *b) {
    if (b->mem) cudaFree(b->mem);
    moe_rows_release(&b->moe);
    *b = PrefillBuffers{};
}

extern "C" int arc_model_prefill_reserve(arc_model *model, int32_t max_chunk) {
    ARC_REQUIRE(model, "model is null");
    const ModelParts mp = model_parts(model);
    const arc_model_config &c = mp.cfg;
    arc_context *ctx = mp.ctx;
    ARC_REQUIRE(max_chunk > 0, "max_chunk must be positive, got %d", max_chunk);
    ARC_REQUIRE(!ctx->capturing, "the prefill's buffers cannot be reserved while a graph is being captured");
    // A chunk never holds more tokens than the context.
    const int32_t chunk = max_chunk < c.max_seq ? max_chunk : c.max_seq;
    PrefillBuffers *b = mp.prefill;
    if (chunk <= b->max_chunk) return ARC_OK;

    const uint64_t rows = (uint64_t)chunk;
    // The prompt's scores (arc_model_prompt_logprobs) use the qkv rows once a chunk's layers are
    // done: the logits of up to score_rows rows and their slices' partials.
    const int32_t score_rows = chunk < SCORE_ROWS ? chunk : SCORE_ROWS;
    uint64_t score_bytes = 0;
    ARC_TRY(arc_op_row_logprobs_scratch_bytes(score_rows, c.vocab, &score_bytes));
    score_bytes += (uint64_t)score_rows * c.vocab * 4;
    // The gate/up product's float32 rows, on an sm_90 GPU: as many as GU_BYTES hold (whole tiles
    // of 128, at least one), no more than a chunk has.
    int32_t gu_rows = 0;
    if (gemm_sm90_available(ctx)) {
        const uint64_t fit = GU_BYTES / (8ull * (uint64_t)mp.most_ffn) / 128 * 128;
        const uint64_t want = fit < 128 ? 128 : fit;
        gu_rows = (int32_t)(want < rows ? want : rows);
    }
    // The attention's partials (prefill_attention.cu) for as many queries as 64 MB hold at the
    // longest context (whole tiles of 64, at least one), no more than a chunk has.
    uint64_t per_query = 0;  // the most any layer's dims take
    for (int l = 0; l < c.n_layers; ++l) {
        const uint64_t f = prefill_attention_part_floats(c.n_heads, layer_dims(c, l).hd, 1, c.max_seq - 1);
        per_query = f > per_query ? f : per_query;
    }
    uint64_t part_rows = per_query ? (16ull << 20) / per_query / 64 * 64 : 0;
    part_rows = per_query ? (part_rows < 64 ? 64 : part_rows < rows ? part_rows : rows) : 0;
    const uint64_t sizes[13] = {
        rows * c.dim * 4, rows * c.dim * 2, rows * mp.dn.qkv_alloc * 4 > score_bytes ? rows * mp.dn.qkv_alloc * 4 : score_bytes,
        rows * mp.most.q_dim * 2, rows * mp.dn.att_dim * 2, rows * mp.most_ffn * 2, mp.dequant_elems * 2,
        (uint64_t)gu_rows * mp.most_ffn * 8, c.post_norms ? rows * c.dim * 4 : 0, part_rows * per_query * 4,
        rows * c.n_layers * c.ple_dim * 4, rows * c.ple_dim * 4, rows * c.ple_dim * 2,
    };
    uint64_t off[13], at = 0;
    for (int i = 0; i < 13; ++i) {
        off[i] = at;
        at = (at + sizes[i] + 255) / 256 * 256;
    }
    ARC_TRY(moe_rows_reserve(ctx, c, chunk, &b->moe));
    void *mem = nullptr;
    ARC_CUDA(ctx, cudaMalloc(&mem, at));  // on failure the old reservation stands
    if (b->mem) cudaFree(b->mem);
    uint8_t *base = (uint8_t *)mem;
    b->mem = mem;
    b->bytes = at;
    b->max_chunk = chunk;
    b->x = (float *)(base + off[0]);
    b->xn = (uint16_t *)(base + off[1]);
    b->qkv = (float *)(base + off[2]);
    b->q = (uint16_t *)(base + off[3]);
    b->att = (uint16_t *)(base + off[4]);
    b->h = (uint16_t *)(base + off[5]);
    b->wdq = mp.dequant_elems ? (uint16_t *)(base + off[6]) : nullptr;
    b->gu = gu_rows ? (float *)(base + off[7]) : nullptr;
    b->gu_rows = gu_rows;
    b->t = c.post_norms ? (float *)(base + off[8]) : nullptr;
    b->score_rows = score_rows;
    b->attn_part = part_rows ? (float *)(base + off[9]) : nullptr;
    b->attn_part_n = part_rows * per_query;
    b->ple = c.ple_dim ? (float *)(base + off[10]) : nullptr;
    b->pg = c.ple_dim ? (float *)(base + off[11]) : nullptr;
    b->pgb = c.ple_dim ? (uint16_t *)(base + off[12]) : nullptr;
    return ARC_OK;
}

static int launch_rmsnorm_rows(arc_context *ctx, const float *x, int rows, int dim, const RmsNorm &norm,
                               uint16_t *xn) {
    return arc_launch_pdl(ctx, "rmsnorm_rows_kernel", rmsnorm_rows_kernel, dim3(rows), dim3(ROWS_THREADS), 0, x,
                          norm.w, dim, norm.eps, norm.add, xn);
}

// One of the prefill's products: c (n, sum of rows) = a W^T (+ bias) (+ c) for W made of `count`
// consecutive parts of rows[i] x k weights.
struct PartsProduct {
    const uint16_t *a = nullptr;
    const Weight *parts = nullptr;
    const int32_t *rows = nullptr;
    int count = 1, n = 0;
    int32_t k = 0;
    const uint16_t *bias = nullptr;
    int accumulate = 0;
    float *c = nullptr;
};

// The bf16 matrix q reads, made of q.count consecutive parts of q.rows[i] x q.k weights: the
// weights themselves where every part is bf16, else each part dequantized (or copied) into the
// scratch in turn. The product that reads the scratch waits for it on the device.
static int bf16_matrix(arc_context *ctx, const PartsProduct &q, uint16_t *scratch, const uint16_t **out) {
    const Weight *parts = q.parts;
    const int32_t *rows = q.rows, cols = q.k;
    const int n = q.count;
    bool quantized = false;
    for (int i = 0; i < n; ++i) quantized |= parts[i].format != ARC_FORMAT_BF16;
    if (!quantized) {
        *out = (const uint16_t *)parts[0].p;
        return ARC_OK;
    }
    uint64_t at = 0;
    for (int i = 0; i < n; ++i) {
        if (parts[i].format == ARC_FORMAT_BF16)
            ARC_CUDA(ctx, cudaMemcpyAsync(scratch + at, parts[i].p, (uint64_t)rows[i] * cols * 2,
                                          cudaMemcpyDeviceToDevice, ctx->stream));
        else
            ARC_TRY(arc_op_dequantize(ctx, parts[i].format, parts[i].p, rows[i], cols, scratch + at));
        at += (uint64_t)rows[i] * cols;
    }
    *out = scratch;
    return ARC_OK;
}

// The product q: a chunk of up to QUANT_DIRECT_ROWS tokens reads quantized parts packed, one
// product for each run of parts of one format (they lie one after the other); otherwise one
// product over bf16_matrix's matrix, made in scratch.
static int product(arc_context *ctx, const PartsProduct &q, uint16_t *scratch) {
    const uint16_t *a = q.a, *bias = q.bias;
    const Weight *parts = q.parts;
    const int32_t *rows = q.rows, k = q.k;
    const int count = q.count, n = q.n, accumulate = q.accumulate;
    float *c = q.c;
    int32_t total = 0;
    bool quantized = false;
    for (int i = 0; i < count; ++i) {
        total += rows[i];
        quantized |= parts[i].format != ARC_FORMAT_BF16;
    }
    if (quantized && n <= QUANT_DIRECT_ROWS) {
        int32_t at = 0;
        for (int i = 0; i < count;) {
            int j = i, cols = 0;
            while (j < count && parts[j].format == parts[i].format) cols += rows[j++];
            ARC_TRY(gemm_weight(ctx, "arc_model_prefill", parts[i],
                                {.a = a, .m = n, .n = cols, .k = k, .bias = bias ? bias + at : nullptr,
                                 .accumulate = accumulate, .c = c + at, .ldc = total}));
            at += cols;
            i = j;
        }
        return ARC_OK;
    }
    const uint16_t *w;
    ARC_TRY(bf16_matrix(ctx, q, scratch, &w));
    return arc_op_gemm_bf16(ctx, a, w, n, total, k, bias, accumulate, c);
}

// The prefill's form of each op, for one chunk of n tokens at positions start..start + n - 1.
struct PrefillOps {
    const ModelParts &p;
    int n, start;

    // rmsnorm(x, ATTN_NORM) through the parts' product into qkv (rows of the parts' rows).
    int in_product(const InParts &in, const LayerParts &lw, const uint16_t *bias) {
        const PrefillBuffers &b = *p.prefill;
        ARC_TRY(launch_rmsnorm_rows(p.ctx, b.x, n, p.cfg.dim, model_norm(p.cfg, lw.attn_norm), b.xn));
        return product(p.ctx,
                       {.a = b.xn, .parts = in.w, .rows = in.rows, .count = in.count, .n = n, .k = p.cfg.dim,
                        .bias = bias, .c = b.qkv},
                       b.wdq);
    }
    int attn_in(const LayerParts &lw) { return in_product(attn_in_parts(p.cfg, lw), lw, lw.bqkv); }
    int attn_gate(const LayerParts &lw) {
        const PrefillBuffers &b = *p.prefill;
        const AttnDims &d = lw.dims;
        return launch_attn_gate(p.ctx, nullptr, b.att, b.qkv + d.q_dim + 2 * d.kv_dim, d.qkv_rows, n, d.q_dim);
    }
    int dn_in(const LayerParts &lw) { return in_product(dn_in_parts(p.cfg, p.dn, lw), lw, nullptr); }
    // The chunk's rows one after another through the layer's state, the last row's state kept.
    int dn_step(const LayerParts &lw) {
        const PrefillBuffers &b = *p.prefill;
        return deltanet_layer(p.ctx, p.cfg, p.dn, lw, {.u = b.qkv, .rows = n, .pos_add = start, .out_bf16 = b.att});
    }
    int dn_out(const LayerParts &lw) {
        const PrefillBuffers &b = *p.prefill;
        const int dim = p.cfg.dim;
        return product(p.ctx,
                       {.a = b.att, .parts = &lw.dn_out, .rows = &dim, .count = 1, .n = n, .k = p.dn.v_dim,
                        .accumulate = 1, .c = b.x},
                       b.wdq);
    }
    int qk_norm(const LayerParts &lw) { return launch_head_norm(p.ctx, head_norm_args(p.cfg, lw, p.prefill->qkv, n)); }
    int attend(const LayerParts &lw) {
        const arc_model_config &c = p.cfg;
        const PrefillBuffers &b = *p.prefill;
        return prefill_attention_layer(p.ctx, b.qkv, layer_attn(c, lw), lw.kv, c.n_heads, lw.dims.n_kv, lw.dims.hd,
                                       c.max_seq, n, start, b.q, b.att, b.attn_part, b.attn_part_n,
                                       lw.dims.qkv_rows);
    }
    int attn_out(const LayerParts &lw) {
        const PrefillBuffers &b = *p.prefill;
        const int dim = p.cfg.dim;
        return product(p.ctx,
                       {.a = b.att, .parts = &lw.wo, .rows = &dim, .count = 1, .n = n, .k = lw.dims.q_dim, .bias = lw.bo,
                        .accumulate = 1, .c = b.x},
                       b.wdq);
    }
    int ffn_in(const LayerParts &lw) {
        const PrefillBuffers &b = *p.prefill;
        const int dim = p.cfg.dim, ffn = lw.ffn, gate_up_rows = 2 * ffn;
        const uint16_t *w;
        ARC_TRY(launch_rmsnorm_rows(p.ctx, b.x, n, dim, model_norm(p.cfg, lw.mlp_norm), b.xn));
        if (lw.w_gate_up.format != ARC_FORMAT_BF16 && n <= QUANT_DIRECT_ROWS)
            return gemm_glu_weight(p.ctx, "arc_model_prefill", lw.w_gate_up,
                                   {.a = b.xn, .m = n, .n = ffn, .k = dim, .act = p.cfg.activation, .h = b.h});
        ARC_TRY(
            bf16_matrix(p.ctx, {.parts = &lw.w_gate_up, .rows = &gate_up_rows, .count = 1, .k = dim}, b.wdq, &w));
        return gemm_swiglu_rows(p.ctx, "arc_model_prefill", w,
                                {.a = b.xn, .m = n, .n = ffn, .k = dim, .act = p.cfg.activation, .h = b.h}, b.gu,
                                b.gu_rows);
    }
    int ffn_out(const LayerParts &lw) {
        const PrefillBuffers &b = *p.prefill;
        const int dim = p.cfg.dim, ffn = lw.ffn;
        return product(p.ctx,
                       {.a = b.h, .parts = &lw.w_down, .rows = &dim, .count = 1, .n = n, .k = ffn, .accumulate = 1,
                        .c = b.x},
                       b.wdq);
    }
    int attn_out_norm(const LayerParts &lw) {
        const PrefillBuffers &b = *p.prefill;
        const int dim = p.cfg.dim;
        ARC_TRY(product(p.ctx,
                        {.a = b.att, .parts = &lw.wo, .rows = &dim, .count = 1, .n = n, .k = lw.dims.q_dim, .c = b.t},
                        b.wdq));
        return launch_add_norm_rows(p.ctx, b.x, b.t, n, dim, model_norm(p.cfg, lw.post_attn_norm));
    }
    int ffn_out_norm(const LayerParts &lw) {
        const PrefillBuffers &b = *p.prefill;
        const int dim = p.cfg.dim, ffn = lw.ffn;
        ARC_TRY(product(p.ctx, {.a = b.h, .parts = &lw.w_down, .rows = &dim, .count = 1, .n = n, .k = ffn, .c = b.t},
                        b.wdq));
        return launch_add_norm_rows(p.ctx, b.x, b.t, n, dim, model_norm(p.cfg, lw.post_ffn_norm));
    }
    int moe_in(const LayerParts &lw) {
        const PrefillBuffers &b = *p.prefill;
        ARC_TRY(launch_rmsnorm_rows(p.ctx, b.x, n, p.cfg.dim, model_norm(p.cfg, lw.mlp_norm), b.xn));
        return moe_prefill_in(p, lw, n);
    }
    int moe_out(const LayerParts &lw) { return moe_prefill_out(p, lw, n); }
    int experts_beside(const LayerParts &lw) {
        const PrefillBuffers &b = *p.prefill;
        const int dim = p.cfg.dim, ffn = lw.ffn;
        ARC_TRY(product(p.ctx, {.a = b.h, .parts = &lw.w_down, .rows = &dim, .count = 1, .n = n, .k = ffn, .c = b.t},
                        b.wdq));
        // the router's input rmsnorm(x) * ROUTER_SCALE (factors, never 1 + w), then the experts'
        ARC_TRY(launch_rmsnorm_rows(p.ctx, b.x, n, dim, {lw.router_scale, p.cfg.rms_eps, 0.0f}, b.xn));
        ARC_TRY(moe_prefill_route(p, lw, n));
        ARC_TRY(launch_rmsnorm_rows(p.ctx, b.x, n, dim, model_norm(p.cfg, lw.moe_norm), b.xn));
        return moe_prefill_beside(p, lw, n);
    }
    int layer_scalar(const LayerParts &lw) {
        return launch_scale_rows(p.ctx, p.prefill->x, n, p.cfg.dim, lw.layer_scalar);
    }
    int per_layer_input(const LayerParts &lw) { return ple_prefill_layer(p, lw, n); }
};

// One chunk of n tokens at positions start..start + n - 1 through every layer; x holds their
// residual streams afterwards.
static int prefill_chunk(arc_model *model, const ModelParts &mp, const int32_t *tokens, int n, int start) {
    const arc_model_config &c = mp.cfg;
    ARC_TRY(arc_launch_pdl(mp.ctx, "embed_rows_kernel", embed_rows_kernel, dim3(n), dim3(ROWS_THREADS), 0, mp.embed,
                           c.vocab, c.dim, tokens, embed_scale(c), mp.prefill->x));
    if (c.ple_dim) ARC_TRY(ple_prefill_inputs(mp, tokens, n));  // the rows' per-layer inputs
    PrefillOps ops{mp, n, start};
    return run_layers(model, mp, ops);
}

// What the rows of a prompt are scored into (arc_model_prompt_logprobs).
struct Scores {
    int32_t vocab, top_n;
    float *logprob;
    int32_t *top_ids;
    float *top_values;
};

// Rows [0, rows) of the chunk in x scored against targets[0..rows), into entries done.. of s. A
// row's logits are the decode's GEMV of it, lm_head @ rmsnorm(x, final_norm), what the prefill
// computes for its last position: a row scores, bit for bit, what a generation from the prompt up
// to it draws its first token from. Ranked score_rows rows at a time.
static int score_chunk(const ModelParts &mp, int rows, const int32_t *targets, const Scores &s, int32_t done) {
    const PrefillBuffers &b = *mp.prefill;
    const arc_model_config &c = mp.cfg;
    float *logits = b.qkv, *part = b.qkv + (size_t)b.score_rows * c.vocab;
    for (int g = 0; g < rows; g += b.score_rows) {
        const int m = rows - g < b.score_rows ? rows - g : b.score_rows;
        for (int r = 0; r < m; ++r)
            ARC_TRY(gemv_weight(mp.ctx, mp.lm_head,
                                {.x = b.x + (size_t)(g + r) * c.dim, .rows = c.vocab, .cols = c.dim,
                                 .norm_weight = mp.final_norm, .eps = c.rms_eps, .norm_add = norm_offset(c),
                                 .y = logits + (size_t)r * c.vocab}));
        if (c.final_softcap > 0.0f) ARC_TRY(launch_softcap_rows(mp.ctx, logits, m, c.vocab, c.vocab, c.final_softcap));
        const size_t at = (size_t)done + g;
        ARC_TRY(arc_op_row_logprobs(mp.ctx, logits, m, c.vocab, s.vocab, s.top_n, targets + g, part,
                                    s.logprob + at, s.top_ids + at * ARC_MAX_TOP_LOGPROBS,
                                    s.top_values + at * ARC_MAX_TOP_LOGPROBS));
    }
    return ARC_OK;
}

// The prefill of tokens[0..n) from position start, chunk by chunk, each chunk's rows scored where
// `scores` is given; then the last position's logits.
static int prefill_run(arc_model *model, const char *who, const int32_t *tokens, int32_t n, int32_t start,
                       const Scores *scores) {
    const ModelParts mp = model_parts(model);
    const arc_model_config &c = mp.cfg;
    ARC_REQUIRE_AS(who, !mp.ctx->comm, "the prefill does not run on a split model yet (tensor parallelism)");
    ARC_REQUIRE_AS(who, n >= 1, "n must be at least 1, got %d", n);
    ARC_REQUIRE_AS(who, start >= 0 && (int64_t)start + n <= c.max_seq,
                   "tokens at positions %d..%lld do not fit in max_seq %d", start, (long long)start + n - 1,
                   c.max_seq);
    const int32_t chunk = mp.prefill->max_chunk;
    ARC_REQUIRE_AS(who, chunk > 0, "no prefill buffers: call arc_model_prefill_reserve first");
    ARC_TRY(model_check_uploaded(model, who));
    int32_t last = 0;
    for (int32_t off = 0; off < n; off += chunk) {
        last = n - off < chunk ? n - off : chunk;
        ARC_TRY(prefill_chunk(model, mp, tokens + off, last, start + off));
        const int32_t scored = last < n - 1 - off ? last : n - 1 - off;  // the last token has no target
        if (scores && scored > 0) ARC_TRY(score_chunk(mp, scored, tokens + off + 1, *scores, off));
    }
    // logits = lm_head @ rmsnorm(x, final_norm) of the last position, as the decode computes it.
    const float *x_last = mp.prefill->x + (size_t)(last - 1) * c.dim;
    ARC_TRY(gemv_weight(mp.ctx, mp.lm_head,
                        {.x = x_last, .rows = c.vocab, .cols = c.dim, .norm_weight = mp.final_norm, .eps = c.rms_eps,
                         .norm_add = norm_offset(c), .y = mp.logits}));
    return c.final_softcap > 0.0f ? launch_softcap_rows(mp.ctx, mp.logits, 1, c.vocab, c.vocab, c.final_softcap) : ARC_OK;
}

extern "C" int arc_model_prefill(arc_model *model, const int32_t *tokens, int32_t n, int32_t start) {
    ARC_REQUIRE(model && tokens, "null argument");
    return prefill_run(model, __func__, tokens, n, start, nullptr);
}

extern "C" int arc_model_prompt_logprobs(arc_model *model, const int32_t *tokens, int32_t n, int32_t start,
                                         int32_t vocab, int32_t top_n, float *logprob, int32_t *top_ids,
                                         float *top_values) {
    ARC_REQUIRE(model && tokens && logprob && top_ids && top_values, "null argument");
    ARC_REQUIRE(n >= 2, "a prompt to score needs at least 2 tokens, got %d", n);
    const int32_t width = model_parts(model).cfg.vocab;
    ARC_REQUIRE(vocab >= 1 && vocab <= width, "vocab %d must be in 1..%d (the lm_head's rows)", vocab, width);
    ARC_REQUIRE(top_n >= 0 && top_n <= ARC_MAX_TOP_LOGPROBS, "top_n must be in 0..%d, got %d",
                ARC_MAX_TOP_LOGPROBS, top_n);
    const Scores s{vocab, top_n, logprob, top_ids, top_values};
    return prefill_run(model, __func__, tokens, n, start, &s);
}
