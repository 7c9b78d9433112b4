// moe.cu -- a mixture of experts' layer (arc.h: ARC_OP_MOE_IN, ARC_OP_MOE_OUT) with the routing
// kept on the device: the router's logits, then route_kernel's top k and weights (arc_routing's
// order of softmax and top k, ties to the lower expert) into device memory, then products that
// read only the chosen experts' rows. Every launch is the same whatever the routing, so the
// decode's step graph is captured once and replays for every token.
//
// The decode (one row):
//   MOE_IN   gemv           logits = [ROUTER; SHARED_ROUTER] @ n (+ ROUTER_BIAS), n = rmsnorm(x, mlp_norm)
//            route_kernel   ids (k), weights (k), the shared expert's sigmoid
//            gemv<routed>   h[j] = weight_j * act(Wgate_e @ n (+ bg_e)) * (Wup_e @ n (+ bu_e)), e = ids[j], one launch
//                           for the k experts (gemv_common.cuh's GemvRoute)
//            gemv<routed>   the shared expert's GLU times its sigmoid, after them
//   MOE_OUT  gemv<routed>   x += sum_j Wdown_e @ h[j]: one dot a row over the k segments, each
//                           from its expert's rows, so the weighted sum needs no kernel of its own
//            gemv           x += Wdown_shared @ h_shared
// The prefill (a chunk of n rows, normed into xn):
//   MOE_IN   gemm           logits (n, n_experts + 1)
//            route_kernel   a block a row
//            sort_kernel    each expert's rows together (counts, offsets, the sorted order)
//            gemm grouped   h (sorted) = act(xn Wgate_e^T) * (xn Wup_e^T), one launch, a grid
//                           plane an expert (gemm.cuh's grouped GemmArgs)
//            gemm_swiglu    the shared expert's GLU
//   MOE_OUT  gemm grouped   y (sorted) = h Wdown_e^T
//            gemm           the shared expert's down
//            moe_combine_kernel x += sum_j weight_j y[row of (t, j)] (+ sigmoid * shared), in order
//                           of choice: what a row gets does not depend on the others in its chunk.
// Beside a dense FFN (Gemma 4, arc_model_config.experts_beside) the router reads its own norm of x
// and the experts another, and the experts' sum is normed with the dense FFN's output before the
// residual add: moe_decode_beside, moe_prefill_beside.
#include <stdint.h>

#include "model/gemm/gemm.cuh"
#include "model/gemv/head_argmax.cuh"
#include "model/norms.cuh"
#include "model/products.cuh"
#include "moe.cuh"

enum { ROUTE_THREADS = 256, SORT_THREADS = 1024, COMBINE_THREADS = 256 };

// Row blockIdx.x of logits (rows of `stride`; n_experts of them, then with `shared` the shared
// expert's gate) routed: ids (k a row) and weights (k + 1 a row: the experts', then the shared
// expert's sigmoid). Top k by value, ties to the lower expert (head_argmax.cuh's key order, one
// distinct key an expert); SOFTMAX_TOPK ranks softmax(p), its weights those probabilities (over
// their sum with norm); TOPK_SOFTMAX ranks p, its weights the softmax of the k chosen logits. The
// experts' logits are p times `scale` (1 but beside a dense FFN), and with expert_scale (bf16, one
// an expert) each chosen expert's weight is times its own.
// Each thread ranks its experts against every key at once (no round per choice), and the k
// weights are added in order of choice.
__global__ void __launch_bounds__(ROUTE_THREADS)
route_kernel(const float *__restrict__ logits, int stride, int n_experts, int k, int routing, int norm, int shared,
             float scale, const uint16_t *__restrict__ expert_scale, int32_t *__restrict__ ids,
             float *__restrict__ weights) {
    __shared__ float v[MOE_MAX_EXPERTS];
    __shared__ unsigned long long key[MOE_MAX_EXPERTS];
    __shared__ float red[ROUTE_THREADS / 32];
    __shared__ int chosen[MOE_MAX_USED];
    pdl_launch_dependents();
    pdl_wait();
    const int row = blockIdx.x, tid = threadIdx.x;
    const float *p = logits + (size_t)row * stride;
    float m = -INFINITY;
    for (int i = tid; i < n_experts; i += ROUTE_THREADS) {
        v[i] = p[i] * scale;
        m = fmaxf(m, v[i]);
    }
    if (routing == ARC_ROUTE_SOFTMAX_TOPK) {  // v = softmax(p): exp(p - max) over their sum
        m = block_max(m, red);
        float s = 0.0f;
        for (int i = tid; i < n_experts; i += ROUTE_THREADS) {
            v[i] = expf(v[i] - m);
            s += v[i];
        }
        s = block_sum(s, red);
        for (int i = tid; i < n_experts; i += ROUTE_THREADS) v[i] = v[i] / s;
    }
    for (int i = tid; i < n_experts; i += ROUTE_THREADS) key[i] = argmax_key(v[i], i);
    __syncthreads();
    for (int i = tid; i < n_experts; i += ROUTE_THREADS) {
        const unsigned long long mine = key[i];
        int rank = 0;
        for (int j = 0; j < n_experts; ++j) rank += key[j] > mine;
        if (rank < k) chosen[rank] = i;
    }
    __syncthreads();
    if (tid != 0) return;
    float w[MOE_MAX_USED], sum = 0.0f;
    const float top = v[chosen[0]];
    for (int j = 0; j < k; ++j) {
        w[j] = routing == ARC_ROUTE_SOFTMAX_TOPK ? v[chosen[j]] : expf(v[chosen[j]] - top);
        sum += w[j];
    }
    const bool divide = routing == ARC_ROUTE_TOPK_SOFTMAX || norm;
    for (int j = 0; j < k; ++j) {
        ids[(size_t)row * k + j] = chosen[j];
        const float wj = divide ? w[j] / sum : w[j];
        weights[(size_t)row * (k + 1) + j] = expert_scale ? wj * bf16_to_f32(expert_scale[chosen[j]]) : wj;
    }
    weights[(size_t)row * (k + 1) + k] = shared ? 1.0f / (1.0f + expf(-p[n_experts])) : 0.0f;
}

// The rows' choices ids (entries = rows k) sorted by expert: offsets (n_experts + 1), the token
// of each sorted row (order) and the sorted row of each choice (slot_row). One block. Rows of an
// expert land in any order: each sorted row's products depend on that row alone.
__global__ void __launch_bounds__(SORT_THREADS)
sort_kernel(const int32_t *__restrict__ ids, int entries, int k, int n_experts, int32_t *__restrict__ offsets,
            int32_t *__restrict__ order, int32_t *__restrict__ slot_row) {
    __shared__ int count[MOE_MAX_EXPERTS];
    pdl_launch_dependents();
    pdl_wait();
    const int tid = threadIdx.x;
    for (int e = tid; e < n_experts; e += SORT_THREADS) count[e] = 0;
    __syncthreads();
    for (int i = tid; i < entries; i += SORT_THREADS) atomicAdd(&count[ids[i]], 1);
    __syncthreads();
    if (tid == 0) {  // exclusive prefix sums; each count becomes its expert's cursor
        int at = 0;
        for (int e = 0; e < n_experts; ++e) {
            const int c = count[e];
            offsets[e] = at;
            count[e] = at;
            at += c;
        }
        offsets[n_experts] = at;
    }
    __syncthreads();
    for (int i = tid; i < entries; i += SORT_THREADS) {
        const int r = atomicAdd(&count[ids[i]], 1);
        order[r] = i / k;
        slot_row[i] = r;
    }
}

// x[t] += sum_j weights[t, j] y[slot_row[t, j]] (+ weights[t, k] sy[t]), the sum in order of
// choice, as the reference adds it; one block a row t. With store, x[t] = the sum instead.
__global__ void __launch_bounds__(COMBINE_THREADS)
moe_combine_kernel(float *__restrict__ x, const float *__restrict__ y, const int32_t *__restrict__ slot_row,
               const float *__restrict__ weights, int k, int dim, const float *__restrict__ sy, int store) {
    pdl_launch_dependents();
    pdl_wait();
    const int t = blockIdx.x;
    const int32_t *rows = slot_row + (size_t)t * k;
    const float *w = weights + (size_t)t * (k + 1);
    for (int d = threadIdx.x; d < dim; d += COMBINE_THREADS) {
        float out = y[(size_t)rows[0] * dim + d] * w[0];
        for (int j = 1; j < k; ++j) out = out + y[(size_t)rows[j] * dim + d] * w[j];
        if (sy) out = out + w[k] * sy[(size_t)t * dim + d];
        if (store)
            x[(size_t)t * dim + d] = out;
        else
            x[(size_t)t * dim + d] += out;
    }
}

int check_moe_limits(const arc_model_config &c, const char *who) {
    if (c.n_experts == 0) return ARC_OK;
    ARC_REQUIRE_AS(who, c.n_experts <= MOE_MAX_EXPERTS, "config.n_experts must be at most %d on the GPU, got %d",
                   MOE_MAX_EXPERTS, c.n_experts);
    ARC_REQUIRE_AS(who, c.n_experts_used <= MOE_MAX_USED,
                   "config.n_experts_used must be at most %d on the GPU, got %d", MOE_MAX_USED, c.n_experts_used);
    const long long routed = (long long)c.n_experts_used * c.expert_ffn_dim;
    ARC_REQUIRE_AS(who, c.expert_ffn_dim % 8 == 0 && routed <= GEMV_MAX_COLS,
                   "config.expert_ffn_dim must be a multiple of 8 with n_experts_used * expert_ffn_dim at most %d, "
                   "got %d and %lld", GEMV_MAX_COLS, c.expert_ffn_dim, routed);
    ARC_REQUIRE_AS(who, c.shared_ffn_dim % 8 == 0 && c.shared_ffn_dim <= GEMV_MAX_COLS,
                   "config.shared_ffn_dim must be a multiple of 8 up to %d, got %d", GEMV_MAX_COLS, c.shared_ffn_dim);
    return ARC_OK;
}

// Beside a dense FFN the router's logits are scaled by 1 / sqrt(dim) and the weights by each
// expert's factor (arc_model_config: experts_beside).
static int launch_route(arc_context *ctx, const float *logits, int rows, const arc_model_config &c,
                        const LayerParts &lw, int32_t *ids, float *weights) {
    const int shared = c.shared_ffn_dim > 0, stride = c.n_experts + shared;
    const float scale = c.experts_beside ? (float)(1.0 / sqrt((double)c.dim)) : 1.0f;
    return arc_launch_pdl(ctx, "route_kernel", route_kernel, dim3(rows), dim3(ROUTE_THREADS), 0, logits, stride,
                          c.n_experts, c.n_experts_used, c.routing, c.norm_topk, shared, scale,
                          (const uint16_t *)lw.expert_scale, ids, weights);
}

// ---- The decode ------------------------------------------------------------------------------

int moe_decode_in(const ModelParts &p, const LayerParts &lw) {
    const arc_model_config &c = p.cfg;
    const int k = c.n_experts_used, f = c.expert_ffn_dim, s = c.shared_ffn_dim;
    const float eps = c.rms_eps, add = norm_offset(c);
    ARC_TRY(gemv_weight(p.ctx, lw.router,
                        {.x = p.x, .rows = c.n_experts + (s > 0), .cols = c.dim, .bias = lw.router_bias,
                         .norm_weight = lw.mlp_norm, .eps = eps, .norm_add = add, .y = p.router}));
    ARC_TRY(launch_route(p.ctx, p.router, 1, c, lw, p.route_ids, p.route_w));
    const GemvRoute experts{p.route_ids, p.route_w, k, f, c.n_experts * f};
    ARC_TRY(gemv_routed_weight(p.ctx, lw.e_gate_up,
                               {.x = p.x, .rows = k * f, .cols = c.dim, .bias = lw.e_gate_up_bias,
                                .norm_weight = lw.mlp_norm, .eps = eps, .norm_add = add, .act = c.activation,
                                .y = p.h},
                               /*gated=*/true, experts));
    if (s == 0) return ARC_OK;
    const GemvRoute shared{nullptr, p.route_w + k, 1, s, s};
    return gemv_routed_weight(p.ctx, lw.s_gate_up,
                              {.x = p.x, .rows = s, .cols = c.dim, .norm_weight = lw.mlp_norm, .eps = eps,
                               .norm_add = add, .act = c.activation, .y = p.h + (size_t)k * f},
                              /*gated=*/true, shared);
}

int moe_decode_out(const ModelParts &p, const LayerParts &lw) {
    const arc_model_config &c = p.cfg;
    const int k = c.n_experts_used, f = c.expert_ffn_dim, s = c.shared_ffn_dim;
    // The experts' down biases, each times its expert's weight (h is already weighted).
    const GemvRoute experts{p.route_ids, lw.e_down_bias ? p.route_w : nullptr, k, f, 0};
    ARC_TRY(gemv_routed_weight(p.ctx, lw.e_down, {.x = p.h, .rows = c.dim, .cols = k * f, .bias = lw.e_down_bias,
                                                  .accumulate = 1, .y = p.x},
                               /*gated=*/false, experts));
    if (s == 0) return ARC_OK;
    return gemv_weight(p.ctx, lw.s_down,
                       {.x = p.h + (size_t)k * f, .rows = c.dim, .cols = s, .accumulate = 1, .y = p.x});
}

// The experts beside the dense FFN, whose GLU FFN_IN left in h:
//   gemv           t = Wdown @ h
//   gemv           logits = ROUTER @ (rmsnorm(x) * ROUTER_SCALE)
//   route_kernel   softmax of the logits / sqrt(dim), top k, each weight times its EXPERT_SCALE
//   gemv<routed>   h[j] = weight_j * act(Wgate_e @ n) * (Wup_e @ n), n = rmsnorm(x, MOE_NORM)
//   gemv<routed>   e = sum_j Wdown_e @ h[j]
//   add_norm_pair  x += rmsnorm(rmsnorm(t, FFN_OUT_NORM) + rmsnorm(e, MOE_OUT_NORM), POST_FFN_NORM)
int moe_decode_beside(const ModelParts &p, const LayerParts &lw) {
    const arc_model_config &c = p.cfg;
    const int k = c.n_experts_used, f = c.expert_ffn_dim;
    const float eps = c.rms_eps, add = norm_offset(c);
    ARC_TRY(gemv_weight(p.ctx, lw.w_down, {.x = p.h, .rows = c.dim, .cols = lw.ffn, .y = p.t},
                        ffn_handoff(lw.w_gate_up, lw.w_down, lw.ffn)));
    ARC_TRY(gemv_weight(p.ctx, lw.router,
                        {.x = p.x, .rows = c.n_experts, .cols = c.dim, .norm_weight = lw.router_scale, .eps = eps,
                         .y = p.router}));
    ARC_TRY(launch_route(p.ctx, p.router, 1, c, lw, p.route_ids, p.route_w));
    ARC_TRY(gemv_routed_weight(p.ctx, lw.e_gate_up,
                               {.x = p.x, .rows = k * f, .cols = c.dim, .norm_weight = lw.moe_norm, .eps = eps,
                                .norm_add = add, .act = c.activation, .y = p.h},
                               /*gated=*/true, {p.route_ids, p.route_w, k, f, c.n_experts * f}));
    ARC_TRY(gemv_routed_weight(p.ctx, lw.e_down, {.x = p.h, .rows = c.dim, .cols = k * f, .y = p.e},
                               /*gated=*/false, {p.route_ids, nullptr, k, f, 0}));
    return launch_add_norm_pair_rows(p.ctx, p.x, p.t, p.e, 1, c.dim, beside_norms(c, lw));
}

// ---- The prefill -----------------------------------------------------------------------------

void moe_rows_release(MoeRows *m) {
    if (m->mem) cudaFree(m->mem);
    *m = MoeRows{};
}

int moe_rows_reserve(arc_context *ctx, const arc_model_config &c, int32_t rows, MoeRows *m) {
    if (c.n_experts == 0 || rows <= m->rows) return ARC_OK;
    const uint64_t r = (uint64_t)rows, k = c.n_experts_used, e = c.n_experts;
    const bool sum_rows = c.shared_ffn_dim || c.experts_beside;  // sy: the shared expert's, or the experts' sum
    const uint64_t sizes[10] = {r * (e + 1) * 4, r * k * 4, r * (k + 1) * 4, (e + 1) * 4, r * k * 4, r * k * 4,
                                r * k * c.expert_ffn_dim * 2, r * k * c.dim * 4, r * c.shared_ffn_dim * 2,
                                sum_rows ? r * c.dim * 4 : 0};
    uint64_t off[10], at = 0;
    for (int i = 0; i < 10; ++i) {
        off[i] = at;
        at = (at + sizes[i] + 255) / 256 * 256;
    }
    void *mem = nullptr;
    ARC_CUDA(ctx, cudaMalloc(&mem, at));  // on failure the old reservation stands
    moe_rows_release(m);
    uint8_t *base = (uint8_t *)mem;
    m->mem = mem;
    m->bytes = at;
    m->rows = rows;
    m->logits = (float *)(base + off[0]);
    m->ids = (int32_t *)(base + off[1]);
    m->weights = (float *)(base + off[2]);
    m->offsets = (int32_t *)(base + off[3]);
    m->order = (int32_t *)(base + off[4]);
    m->slot_row = (int32_t *)(base + off[5]);
    m->h = (uint16_t *)(base + off[6]);
    m->y = (float *)(base + off[7]);
    m->sh = c.shared_ffn_dim ? (uint16_t *)(base + off[8]) : nullptr;
    m->sy = sum_rows ? (float *)(base + off[9]) : nullptr;
    return ARC_OK;
}

// A grouped product over the experts of weight w (rows of `cols` weights, rows_per an expert).
static GemmArgs grouped(const MoeRows &m, Weight w, int n, int out, int cols, int rows_per, int groups) {
    uint64_t row = 0;
    arc_format_row_bytes(w.format, cols, &row);  // formats checked at create
    GemmArgs g{w.p, nullptr, n, out, cols, nullptr, nullptr, out, nullptr, 0};
    g.offsets = m.offsets;
    g.w_step = row * (uint64_t)rows_per;
    g.groups = groups;
    return g;
}

int moe_prefill_route(const ModelParts &p, const LayerParts &lw, int n) {
    const arc_model_config &c = p.cfg;
    const PrefillBuffers &b = *p.prefill;
    const MoeRows &m = b.moe;
    const int e = c.n_experts, k = c.n_experts_used, s = c.shared_ffn_dim;
    ARC_TRY(gemm_weight(p.ctx, "arc_model_prefill", lw.router,
                        {.a = b.xn, .m = n, .n = e + (s > 0), .k = c.dim, .bias = lw.router_bias, .c = m.logits,
                         .ldc = e + (s > 0)}));
    ARC_TRY(launch_route(p.ctx, m.logits, n, c, lw, m.ids, m.weights));
    return arc_launch_pdl(p.ctx, "sort_kernel", sort_kernel, dim3(1), dim3(SORT_THREADS), 0, (const int32_t *)m.ids,
                          n * k, k, e, m.offsets, m.order, m.slot_row);
}

// The chosen experts' GLUs of the rows in xn, sorted by expert, into moe.h.
static int prefill_experts_in(const ModelParts &p, const LayerParts &lw, int n) {
    const arc_model_config &c = p.cfg;
    const PrefillBuffers &b = *p.prefill;
    const MoeRows &m = b.moe;
    const int e = c.n_experts, f = c.expert_ffn_dim;
    GemmArgs g = grouped(m, lw.e_gate_up, n, f, c.dim, f, e);
    g.a = b.xn;
    g.a_rows = m.order;
    g.h = m.h;
    g.act = c.activation;
    g.up_rows = e * f;
    g.bias = lw.e_gate_up_bias;  // expert z's gate biases at z f, its up biases e f further
    g.bias_step = f;
    g.up_bias = e * f;
    return gemm_grouped(p.ctx, "arc_model_prefill", lw.e_gate_up.format, g, EPI_SWIGLU);
}

// Their down products into moe.y (sorted rows), each with its expert's bias.
static int prefill_experts_out(const ModelParts &p, const LayerParts &lw, int n) {
    const arc_model_config &c = p.cfg;
    const MoeRows &m = p.prefill->moe;
    GemmArgs g = grouped(m, lw.e_down, n, c.dim, c.expert_ffn_dim, c.dim, c.n_experts);
    g.a = m.h;
    g.c = m.y;
    g.bias = lw.e_down_bias;  // y = h Wdown^T + the expert's bias, before moe_combine_kernel's weight
    g.bias_step = c.dim;
    return gemm_grouped(p.ctx, "arc_model_prefill", lw.e_down.format, g, EPI_STORE);
}

// out[t] (+)= the weighted sum of row t's experts (+ the shared expert's with sy): stored or added.
static int launch_combine(const ModelParts &p, int n, float *out, const float *sy, bool store) {
    const MoeRows &m = p.prefill->moe;
    return arc_launch_pdl(p.ctx, "moe_combine_kernel", moe_combine_kernel, dim3(n), dim3(COMBINE_THREADS), 0, out,
                          (const float *)m.y, (const int32_t *)m.slot_row, (const float *)m.weights,
                          p.cfg.n_experts_used, p.cfg.dim, sy, (int)store);
}

int moe_prefill_in(const ModelParts &p, const LayerParts &lw, int n) {
    const arc_model_config &c = p.cfg;
    const PrefillBuffers &b = *p.prefill;
    const int s = c.shared_ffn_dim;
    ARC_TRY(moe_prefill_route(p, lw, n));
    ARC_TRY(prefill_experts_in(p, lw, n));
    if (s == 0) return ARC_OK;
    return gemm_glu_weight(p.ctx, "arc_model_prefill", lw.s_gate_up,
                           {.a = b.xn, .m = n, .n = s, .k = c.dim, .act = c.activation, .h = b.moe.sh});
}

int moe_prefill_out(const ModelParts &p, const LayerParts &lw, int n) {
    const arc_model_config &c = p.cfg;
    const PrefillBuffers &b = *p.prefill;
    const MoeRows &m = b.moe;
    const int s = c.shared_ffn_dim;
    ARC_TRY(prefill_experts_out(p, lw, n));
    if (s > 0)
        ARC_TRY(gemm_weight(p.ctx, "arc_model_prefill", lw.s_down,
                            {.a = m.sh, .m = n, .n = c.dim, .k = s, .c = m.sy, .ldc = c.dim}));
    return launch_combine(p, n, b.x, s > 0 ? m.sy : nullptr, /*store=*/false);
}

// The prefill's experts beside the dense FFN (moe_decode_beside's, over rows): the dense FFN's
// output already in t, the rows routed (moe_prefill_route) and normed by MOE_NORM into xn.
int moe_prefill_beside(const ModelParts &p, const LayerParts &lw, int n) {
    const PrefillBuffers &b = *p.prefill;
    ARC_TRY(prefill_experts_in(p, lw, n));
    ARC_TRY(prefill_experts_out(p, lw, n));
    ARC_TRY(launch_combine(p, n, b.moe.sy, nullptr, /*store=*/true));
    return launch_add_norm_pair_rows(p.ctx, b.x, b.t, b.moe.sy, n, p.cfg.dim, beside_norms(p.cfg, lw));
}
