// model.cu -- the model handle: a size table of every weight tensor (its format, 64-bit offsets
// into one device buffer), the bf16 KV cache, the float32 activations and logits; uploads; and
// what the forward (forward.cu) and the prefill read of it.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward/layer.cuh"
#include "model/kv_cache.cuh"
#include "model/deltanet.cuh"
#include "model/moe/moe.cuh"
#include "model/qgemv/quant.cuh"

enum { TENSOR_COUNT = ARC_TENSOR_COUNT, ALIGN = 256 };



static bool is_bias(int t) { return t == ARC_TENSOR_BQ || t == ARC_TENSOR_BK || t == ARC_TENSOR_BV; }
static bool is_head_norm(int t) { return t == ARC_TENSOR_Q_NORM || t == ARC_TENSOR_K_NORM; }
static bool is_post_norm(int t) { return t == ARC_TENSOR_POST_ATTN_NORM || t == ARC_TENSOR_POST_FFN_NORM; }


struct arc_model {
    arc_context *ctx;
    arc_model_config cfg;
    AttnDims most;    // each field the largest of every layer's attention dims
    int32_t most_ffn;  // the widest layer's FFN
    DeltaNetDims dn;  // the DeltaNet layers' sizes (all 0 without them)
    // The size table, [TENSOR_COUNT][n_layers] (global tensors at layer 0): each tensor's format,
    // its bytes (0 when this configuration has none) and its offset in `weights`.
    int32_t *format;
    uint64_t *bytes;
    uint64_t *offset;
    uint64_t weight_bytes;
    uint64_t dequant_elems;  // the largest quantized matrix the prefill dequantizes, in weights
    uint8_t *weights;
    bool *uploaded;  // host [TENSOR_COUNT][n_layers]; global tensors use layer 0
    KvPlanes kv;    // the KV cache (kv_cache.cu)
    int kv_layers;  // the layers that keep KV rows: those that attend (not the DeltaNet ones)
    uint64_t act_bytes;  // the decode's activations
    // Activations, all float32, carved from one allocation.
    void *act;
    float *x;        // residual stream (dim)
    float *qkv;      // (most.qkv_rows), or DN_IN's output (dn.qkv_alloc)
    float *att;      // attention output (dn.att_dim)
    float *h;        // swiglu output (ffn_dim)
    float *t;        // a product's output before its post-norm (dim)
    float *e;        // the experts' sum beside the dense FFN, before its norm (dim; experts_beside)
    float *ple, *pg;  // the per-layer inputs (n_layers * ple_dim) and a gate's output (ple_dim), with ple_dim
    float *logits;   // (vocab)
    float *scratch;  // attention partials
    float *router, *route_w;  // MoE: the router's logits (n_experts + 1); the weights (n_experts_used + 1)
    int32_t *route_ids;       // MoE: the chosen experts (n_experts_used)
    PrefillBuffers prefill;  // the prefill's activations, once reserved (prefill.cu)
    SpecBuffers spec;        // a speculative step's, once reserved (speculate.cu)
    // The DeltaNet layers' states: DN_SLOTS of dn.slot_floats for each such layer, in layer order.
    float *dn_state;
    uint64_t dn_state_bytes;
};

static uint64_t align_up(uint64_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

static int slot(const arc_model *m, int t, int layer) {
    return t * m->cfg.n_layers + (tensor_per_layer(t) ? layer : 0);
}

// Bytes of tensor t of layer l in its format.
static uint64_t tensor_bytes(const arc_model *m, int t, int l) {
    uint64_t rows, cols, row = 0;
    table_shape(m->cfg, t, l, &rows, &cols);
    if (t == ARC_TENSOR_ROPE_INV_FREQ) return rows * cols * 4;
    arc_format_row_bytes(m->format[slot(m, t, l)], (int32_t)cols, &row);  // formats checked at create
    return rows * row;
}

// Lays out the weights: the global tensors, then each layer's, in this order; a tensor the
// configuration lacks takes no bytes. Tensors one fused GEMV reads as one matrix are adjacent with
// no padding (Wq Wk Wv, bq bk bv, Wgate Wup, and a mixture of experts' router and the shared
// expert's gate row, the experts' gates and ups and their biases, the shared expert's gate and
// up): every row's size is a multiple of 16 bytes, so the one that follows is still 16-byte
// aligned.
static void build_size_table(arc_model *m) {
    const arc_model_config &c = m->cfg;
    struct Place { int tensor; bool follows; };
    static const Place GLOBAL[] = {{ARC_TENSOR_EMBED, false}, {ARC_TENSOR_FINAL_NORM, false},
                                   {ARC_TENSOR_LM_HEAD, false}, {ARC_TENSOR_PLE_EMBED, false},
                                   {ARC_TENSOR_PLE_PROJECTION, false}, {ARC_TENSOR_PLE_NORM, false}};
    static const Place LAYER[] = {
        {ARC_TENSOR_ROPE_INV_FREQ, false}, {ARC_TENSOR_Q_NORM, false},  {ARC_TENSOR_K_NORM, false},
        {ARC_TENSOR_ATTN_NORM, false},     {ARC_TENSOR_WQ, false},      {ARC_TENSOR_WK, true},
        {ARC_TENSOR_WV, true},             {ARC_TENSOR_WQ_GATE, true},  {ARC_TENSOR_BQ, false},      {ARC_TENSOR_BK, true},
        {ARC_TENSOR_BV, true},             {ARC_TENSOR_WO, false},      {ARC_TENSOR_POST_ATTN_NORM, false},
        {ARC_TENSOR_POST_FFN_NORM, false}, {ARC_TENSOR_MLP_NORM, false}, {ARC_TENSOR_W_GATE, false},
        {ARC_TENSOR_W_UP, true},           {ARC_TENSOR_W_DOWN, false},   {ARC_TENSOR_MOE_ROUTER, false},
        {ARC_TENSOR_SHARED_ROUTER, true},  {ARC_TENSOR_MOE_GATE, false}, {ARC_TENSOR_MOE_UP, true},
        {ARC_TENSOR_MOE_DOWN, false},      {ARC_TENSOR_SHARED_GATE, false}, {ARC_TENSOR_SHARED_UP, true},
        {ARC_TENSOR_SHARED_DOWN, false},   {ARC_TENSOR_DN_QKV, false},   {ARC_TENSOR_DN_Z, true},
        {ARC_TENSOR_DN_B, true},           {ARC_TENSOR_DN_A, true},      {ARC_TENSOR_DN_CONV, false},
        {ARC_TENSOR_DN_A_LOG, false},      {ARC_TENSOR_DN_DT_BIAS, false}, {ARC_TENSOR_DN_NORM, false},
        {ARC_TENSOR_DN_OUT, false},        {ARC_TENSOR_SINKS, false},    {ARC_TENSOR_BO, false},
        {ARC_TENSOR_MOE_ROUTER_BIAS, false}, {ARC_TENSOR_MOE_GATE_BIAS, false}, {ARC_TENSOR_MOE_UP_BIAS, true},
        {ARC_TENSOR_MOE_DOWN_BIAS, false}, {ARC_TENSOR_MOE_NORM, false}, {ARC_TENSOR_FFN_OUT_NORM, false},
        {ARC_TENSOR_MOE_OUT_NORM, false}, {ARC_TENSOR_ROUTER_SCALE, false}, {ARC_TENSOR_EXPERT_SCALE, false},
        {ARC_TENSOR_PLE_GATE, false}, {ARC_TENSOR_PLE_OUT, false}, {ARC_TENSOR_PLE_POST_NORM, false},
        {ARC_TENSOR_LAYER_SCALAR, false}};
    uint64_t at = 0;
    auto put = [&](const Place &p, int l) {
        const int i = slot(m, p.tensor, l);
        m->bytes[i] = tensor_bytes(m, p.tensor, l);
        if (m->bytes[i] == 0) return;  // absent in this configuration
        if (!p.follows) at = align_up(at);
        m->offset[i] = at;
        at += m->bytes[i];
    };
    for (const Place &p : GLOBAL) put(p, 0);
    for (int l = 0; l < c.n_layers; ++l)
        for (const Place &p : LAYER) put(p, l);
    m->weight_bytes = align_up(at);
    // The prefill's largest dequantized matrix: a layer's q, k and v together, Wo, Wgate and Wup
    // together, or Wdown.
    uint64_t most = 0;
    auto quantized = [&](int t, int l) { return m->format[slot(m, t, l)] != ARC_FORMAT_BF16; };
    const uint64_t dim = c.dim;
    for (int l = 0; l < c.n_layers; ++l) {
        const AttnDims d = layer_dims(c, l);
        const uint64_t ffn = (uint64_t)layer_ffn(c, l);
        uint64_t n = 0;
        if (quantized(ARC_TENSOR_WQ, l) || quantized(ARC_TENSOR_WK, l) || quantized(ARC_TENSOR_WV, l))
            n = (uint64_t)d.qkv_rows * dim;
        if (quantized(ARC_TENSOR_WO, l) && dim * d.q_dim > n) n = dim * d.q_dim;
        if (quantized(ARC_TENSOR_W_GATE, l) && 2 * ffn * dim > n) n = 2 * ffn * dim;
        if (quantized(ARC_TENSOR_W_DOWN, l) && dim * ffn > n) n = dim * ffn;
        const uint64_t shared = c.shared_ffn_dim * dim;  // the shared expert's (routed ones stay packed)
        if (quantized(ARC_TENSOR_SHARED_GATE, l) || quantized(ARC_TENSOR_SHARED_DOWN, l)) n = 2 * shared > n ? 2 * shared : n;
        const int dn_in[4] = {ARC_TENSOR_DN_QKV, ARC_TENSOR_DN_Z, ARC_TENSOR_DN_B, ARC_TENSOR_DN_A};
        for (int t : dn_in)
            if (quantized(t, l) && (uint64_t)m->dn.rows * dim > n) n = (uint64_t)m->dn.rows * dim;
        if (quantized(ARC_TENSOR_DN_OUT, l) && dim * m->dn.v_dim > n) n = dim * m->dn.v_dim;
        if (n > most) most = n;
    }
    m->dequant_elems = most;
}

static uint8_t *tensor_at(const arc_model *m, int t, int layer) { return m->weights + m->offset[slot(m, t, layer)]; }
static const uint16_t *bf16_at(const arc_model *m, int t, int layer) {
    return reinterpret_cast<const uint16_t *>(tensor_at(m, t, layer));
}
static Weight weight_at(const arc_model *m, int t, int layer) {
    return Weight{tensor_at(m, t, layer), m->format[slot(m, t, layer)]};
}


// Each tensor's format: bf16 everywhere but the matrices; a matrix's columns fit its format's
// units; Wgate and Wup of a layer share one (one fused product reads them).
static int check_formats(const arc_model *m, const int32_t *formats) {
    const arc_model_config &c = m->cfg;
    for (int t = 0; t < TENSOR_COUNT; ++t) {
        const int layers = tensor_per_layer(t) ? c.n_layers : 1;
        for (int l = 0; l < layers; ++l) {
            const int32_t f = formats[t * c.n_layers + l];
            if (f == ARC_FORMAT_BF16) continue;
            ARC_REQUIRE_AS("arc_model_create_formats", tensor_is_matrix(t),
                           "%s (layer %d) must be bf16 (format 0), got format %d", tensor_name(t), l, f);
            ARC_REQUIRE_AS("arc_model_create_formats", format_quantized(f),
                           "%s (layer %d): unknown format %d (arc_format 0..%d)", tensor_name(t), l, f, FORMAT_LAST);
            uint64_t rows, cols;
            table_shape(c, t, l, &rows, &cols);
            const uint64_t unit = format_super(f) ? QSUPER : QUNIT;
            ARC_REQUIRE_AS("arc_model_create_formats", cols % unit == 0,
                           "%s (layer %d): format %d takes rows of a multiple of %llu weights, got %llu",
                           tensor_name(t), l, f, (unsigned long long)unit, (unsigned long long)cols);
        }
    }
    const int pairs[3][2] = {{ARC_TENSOR_W_GATE, ARC_TENSOR_W_UP}, {ARC_TENSOR_MOE_GATE, ARC_TENSOR_MOE_UP},
                             {ARC_TENSOR_SHARED_GATE, ARC_TENSOR_SHARED_UP}};
    for (const auto &pair : pairs)
        for (int l = 0; l < c.n_layers; ++l) {
            const int32_t g = formats[pair[0] * c.n_layers + l], u = formats[pair[1] * c.n_layers + l];
            ARC_REQUIRE_AS("arc_model_create_formats", g == u, "%s and %s of layer %d must share a format, got %d and %d",
                           tensor_name(pair[0]), tensor_name(pair[1]), l, g, u);
        }
    return ARC_OK;
}

static void model_release(arc_model *m) {
    if (m->weights) cudaFree(m->weights);
    kv_planes_release(&m->kv);
    if (m->act) cudaFree(m->act);
    if (m->dn_state) cudaFree(m->dn_state);
    prefill_buffers_release(&m->prefill);
    spec_buffers_release(&m->spec);
    free(m->uploaded);
    free(m->format);
    free(m->bytes);
    free(m->offset);
    free(m);
}

// Allocates the weights, the KV cache (zeroed) and the activations; on failure the caller
// releases the partial model.
static int model_init(arc_model *m, const int32_t *formats) {
    arc_context *ctx = m->ctx;
    const arc_model_config &c = m->cfg;
    const size_t n = (size_t)TENSOR_COUNT * c.n_layers;
    m->uploaded = (bool *)calloc(n, sizeof(bool));
    m->format = (int32_t *)calloc(n, sizeof(int32_t));
    m->bytes = (uint64_t *)calloc(n, sizeof(uint64_t));
    m->offset = (uint64_t *)calloc(n, sizeof(uint64_t));
    if (!m->uploaded || !m->format || !m->bytes || !m->offset)
        return arc_fail(ARC_OUT_OF_MEMORY, "arc_model_create", "host allocation failed");
    if (formats) memcpy(m->format, formats, n * sizeof(int32_t));
    build_size_table(m);
    ARC_CUDA(ctx, cudaMalloc(&m->weights, m->weight_bytes));

    // Only the attention layers keep KV rows (not a shared one: it reads its source's); a DeltaNet
    // layer's state is its own (dn_state).
    m->kv_layers = c.n_layers - dn_layer_count(c) - c.kv_shared_layers;
    // (A model of DeltaNet layers alone still holds one layer's rows: no pointer is null.)
    if (const int st = kv_planes_create(ctx, c, &m->kv)) return st;

    // h holds the GLU's output, or a mixture of experts' k GLUs and the shared expert's after them.
    const uint64_t routed = (uint64_t)c.n_experts_used * c.expert_ffn_dim + c.shared_ffn_dim;
    const uint64_t h = routed > (uint64_t)m->most_ffn ? routed : (uint64_t)m->most_ffn;
    const uint64_t experts = c.n_experts ? (uint64_t)c.n_experts + 1 : 0, used = c.n_experts ? c.n_experts_used : 0;
    uint64_t at = 0, off[13];
    const uint64_t sizes[13] = {(uint64_t)c.dim * 4, (uint64_t)m->dn.qkv_alloc * 4, (uint64_t)m->dn.att_dim * 4, h * 4,
                                (uint64_t)c.vocab * 4, arc_attention_scratch_bytes(c.n_heads, m->most.hd, c.max_seq),
                                c.post_norms ? (uint64_t)c.dim * 4 : 0, experts * 4, used * 4, (used + 1) * 4,
                                c.experts_beside ? (uint64_t)c.dim * 4 : 0, (uint64_t)c.n_layers * c.ple_dim * 4,
                                (uint64_t)c.ple_dim * 4};
    for (int i = 0; i < 13; ++i) {
        off[i] = at;
        at = align_up(at + sizes[i]);
    }
    ARC_CUDA(ctx, cudaMalloc(&m->act, at));
    m->act_bytes = at;
    ARC_CUDA(ctx, cudaMemsetAsync(m->act, 0, at, ctx->stream));
    uint8_t *base = (uint8_t *)m->act;
    float **parts[7] = {&m->x, &m->qkv, &m->att, &m->h, &m->logits, &m->scratch, &m->t};
    for (int i = 0; i < 7; ++i) *parts[i] = (float *)(base + off[i]);
    m->router = (float *)(base + off[7]), m->route_ids = (int32_t *)(base + off[8]), m->route_w = (float *)(base + off[9]);
    m->e = (float *)(base + off[10]);
    m->ple = c.ple_dim ? (float *)(base + off[11]) : nullptr, m->pg = c.ple_dim ? (float *)(base + off[12]) : nullptr;

    // The DeltaNet states: a slot is read only at positions after 0, each after the step that wrote it.
    m->dn_state_bytes = (uint64_t)dn_layer_count(c) * DN_SLOTS * m->dn.slot_floats * sizeof(float);
    if (m->dn_state_bytes) {
        ARC_CUDA(ctx, cudaMalloc(&m->dn_state, m->dn_state_bytes));
        ARC_CUDA(ctx, cudaMemsetAsync(m->dn_state, 0, m->dn_state_bytes, ctx->stream));
    }
    return ARC_OK;
}

extern "C" int arc_model_create_formats(arc_context *ctx, const arc_model_config *config, const int32_t *formats,
                                        arc_model **out) {
    ARC_REQUIRE(ctx && config && out, "null argument");
    *out = nullptr;
    ARC_REQUIRE(!ctx->capturing, "a model cannot be created while a graph is being captured");
    int st = check_config(config);
    if (st != ARC_OK) return st;
    arc_model *m = (arc_model *)calloc(1, sizeof *m);
    if (!m) return arc_fail(ARC_OUT_OF_MEMORY, __func__, "host allocation failed");
    m->ctx = ctx;
    m->cfg = *config;
    m->most = max_layer_dims(*config);
    m->most_ffn = config->ffn_dim;
    for (int l = 0; l < config->n_layers; ++l)
        m->most_ffn = layer_ffn(*config, l) > m->most_ffn ? layer_ffn(*config, l) : m->most_ffn;
    m->dn = dn_dims(*config, m->most.q_dim, m->most.qkv_rows);
    st = formats ? check_formats(m, formats) : ARC_OK;
    if (st == ARC_OK) st = model_init(m, formats);
    if (st != ARC_OK) {
        model_release(m);
        return st;
    }
    *out = m;
    return ARC_OK;
}

extern "C" int arc_model_create(arc_context *ctx, const arc_model_config *config, arc_model **out) {
    return arc_model_create_formats(ctx, config, nullptr, out);
}

// cudaFree waits for work that may still use the memory: teardown, never the step path.
extern "C" int arc_model_destroy(arc_model *model) {
    ARC_REQUIRE(model, "model is null");
    model_release(model);
    return ARC_OK;
}

// Copies one tensor on the context's stream. From pageable memory the data is staged before the
// call returns; from pinned memory the copy runs later, so the buffer must outlive it.
extern "C" int arc_model_upload(arc_model *model, int32_t tensor, int32_t layer, const void *host,
                                uint64_t bytes) {
    ARC_REQUIRE(model && host, "null argument");
    ARC_REQUIRE(tensor >= 0 && tensor < TENSOR_COUNT, "unknown tensor id %d (valid: 0..%d)", tensor,
                TENSOR_COUNT - 1);
    const arc_model_config &c = model->cfg;
    const char *name = tensor_name(tensor);
    if (tensor_per_layer(tensor))
        ARC_REQUIRE(layer >= 0 && layer < c.n_layers, "%s is a per-layer tensor: layer must be in [0, %d), got %d",
                    name, c.n_layers, layer);
    else
        ARC_REQUIRE(layer == 0, "%s is a global tensor: layer must be 0, got %d", name, layer);
    ARC_REQUIRE(!is_bias(tensor) || c.qkv_bias, "%s: the model was created without q/k/v biases (qkv_bias = 0)",
                name);
    ARC_REQUIRE(!is_head_norm(tensor) || c.qk_norm, "%s: the model was created without q/k norms (qk_norm = 0)",
                name);
    ARC_REQUIRE(!is_post_norm(tensor) || c.post_norms,
                "%s: the model was created without post-attention and post-FFN norms (post_norms = 0)", name);
    ARC_REQUIRE(tensor != ARC_TENSOR_LM_HEAD || !c.tied_embeddings,
                "%s: the model ties the lm_head to the embedding (tied_embeddings = 1)", name);
    const uint64_t want = model->bytes[slot(model, tensor, layer)];
    ARC_REQUIRE(bytes == want, "%s (layer %d) takes exactly %llu bytes, got %llu", name, layer,
                (unsigned long long)want, (unsigned long long)bytes);
    arc_context *ctx = model->ctx;
    ARC_REQUIRE(!ctx->capturing, "uploads are not captured into graphs");
    ARC_CUDA(ctx, cudaMemcpyAsync(tensor_at(model, tensor, layer), host, bytes, cudaMemcpyHostToDevice,
                                  ctx->stream));
    model->uploaded[tensor * c.n_layers + layer] = true;
    return ARC_OK;
}

// The first tensor the forward needs that was never uploaded, as an error; ARC_OK if none.
int model_check_uploaded(const arc_model *m, const char *who) {
    const arc_model_config &c = m->cfg;
    for (int t = 0; t < TENSOR_COUNT; ++t) {
        const int layers = tensor_per_layer(t) ? c.n_layers : 1;
        for (int l = 0; l < layers; ++l) {
            if (m->bytes[slot(m, t, l)] == 0 || m->uploaded[t * c.n_layers + l]) continue;  // absent, or there
            if (tensor_per_layer(t))
                return arc_fail(ARC_INVALID_ARGUMENT, who, "%s of layer %d was never uploaded (arc_model_upload)",
                                tensor_name(t), l);
            return arc_fail(ARC_INVALID_ARGUMENT, who, "%s was never uploaded (arc_model_upload)", tensor_name(t));
        }
    }
    return ARC_OK;
}

LayerParts model_layer(const arc_model *m, int l) {
    LayerParts p;
    p.dims = layer_dims(m->cfg, l);
    p.layer = l;
    p.ffn = layer_ffn(m->cfg, l);
    p.shared = layer_shared(m->cfg, l);
    // A vector the config may lack: null where the table gives it no rows in this layer.
    auto vec = [&](int t) { return m->bytes[slot(m, t, l)] ? bf16_at(m, t, l) : nullptr; };
    p.attn_norm = bf16_at(m, ARC_TENSOR_ATTN_NORM, l), p.mlp_norm = bf16_at(m, ARC_TENSOR_MLP_NORM, l);
    p.bqkv = vec(ARC_TENSOR_BQ), p.q_norm = vec(ARC_TENSOR_Q_NORM), p.k_norm = vec(ARC_TENSOR_K_NORM);
    p.inv_freq = reinterpret_cast<const float *>(tensor_at(m, ARC_TENSOR_ROPE_INV_FREQ, l));
    p.post_attn_norm = vec(ARC_TENSOR_POST_ATTN_NORM), p.post_ffn_norm = vec(ARC_TENSOR_POST_FFN_NORM);
    p.window = layer_window(m->cfg, l);
    p.wq = weight_at(m, ARC_TENSOR_WQ, l), p.wk = weight_at(m, ARC_TENSOR_WK, l), p.wv = weight_at(m, ARC_TENSOR_WV, l);
    p.wo = weight_at(m, ARC_TENSOR_WO, l);
    p.w_gate_up = weight_at(m, ARC_TENSOR_W_GATE, l), p.w_down = weight_at(m, ARC_TENSOR_W_DOWN, l);
    p.router = weight_at(m, ARC_TENSOR_MOE_ROUTER, l);  // the shared expert's gate row follows it
    p.e_gate_up = weight_at(m, ARC_TENSOR_MOE_GATE, l), p.e_down = weight_at(m, ARC_TENSOR_MOE_DOWN, l);
    p.s_gate_up = weight_at(m, ARC_TENSOR_SHARED_GATE, l), p.s_down = weight_at(m, ARC_TENSOR_SHARED_DOWN, l);
    p.wq_gate = weight_at(m, ARC_TENSOR_WQ_GATE, l);
    p.sinks = vec(ARC_TENSOR_SINKS), p.bo = vec(ARC_TENSOR_BO), p.layer_scalar = vec(ARC_TENSOR_LAYER_SCALAR);
    p.router_bias = vec(ARC_TENSOR_MOE_ROUTER_BIAS), p.e_gate_up_bias = vec(ARC_TENSOR_MOE_GATE_BIAS);
    p.e_down_bias = vec(ARC_TENSOR_MOE_DOWN_BIAS);
    p.moe_norm = vec(ARC_TENSOR_MOE_NORM), p.ffn_out_norm = vec(ARC_TENSOR_FFN_OUT_NORM);
    p.moe_out_norm = vec(ARC_TENSOR_MOE_OUT_NORM), p.router_scale = vec(ARC_TENSOR_ROUTER_SCALE);
    p.expert_scale = vec(ARC_TENSOR_EXPERT_SCALE), p.ple_post_norm = vec(ARC_TENSOR_PLE_POST_NORM);
    p.ple_gate = weight_at(m, ARC_TENSOR_PLE_GATE, l), p.ple_out = weight_at(m, ARC_TENSOR_PLE_OUT, l);
    p.dn = layer_dn(m->cfg, l);
    p.dn_in = weight_at(m, ARC_TENSOR_DN_QKV, l), p.dn_z = weight_at(m, ARC_TENSOR_DN_Z, l);
    p.dn_b = weight_at(m, ARC_TENSOR_DN_B, l), p.dn_a = weight_at(m, ARC_TENSOR_DN_A, l);
    p.dn_out = weight_at(m, ARC_TENSOR_DN_OUT, l);
    p.dn_conv = bf16_at(m, ARC_TENSOR_DN_CONV, l), p.dn_a_log = bf16_at(m, ARC_TENSOR_DN_A_LOG, l);
    p.dn_dt_bias = bf16_at(m, ARC_TENSOR_DN_DT_BIAS, l), p.dn_norm = bf16_at(m, ARC_TENSOR_DN_NORM, l);
    p.dn_state = p.dn ? m->dn_state + (uint64_t)dn_ordinal(m->cfg, l) * DN_SLOTS * m->dn.slot_floats : nullptr;
    // The KV cache's rows of the attention layers only, in layer order (arc_model_kv_planes).
    if (!p.dn) p.kv = kv_planes_layer(m->kv, m->cfg, l);
    return p;
}

ModelParts model_parts(arc_model *m) {
    const arc_model_config &c = m->cfg;
    ModelParts p;
    p.ctx = m->ctx;
    p.cfg = c;
    p.most = m->most;
    p.most_ffn = m->most_ffn;
    p.dn = m->dn;
    p.embed = bf16_at(m, ARC_TENSOR_EMBED, 0);
    p.final_norm = bf16_at(m, ARC_TENSOR_FINAL_NORM, 0);
    p.lm_head = weight_at(m, c.tied_embeddings ? ARC_TENSOR_EMBED : ARC_TENSOR_LM_HEAD, 0);
    p.ple_embed = c.ple_dim ? bf16_at(m, ARC_TENSOR_PLE_EMBED, 0) : nullptr;
    p.ple_norm = c.ple_dim ? bf16_at(m, ARC_TENSOR_PLE_NORM, 0) : nullptr;
    p.ple_projection = weight_at(m, ARC_TENSOR_PLE_PROJECTION, 0);
    p.x = m->x;
    p.qkv = m->qkv;
    p.att = m->att;
    p.h = m->h;
    p.scratch = m->scratch;
    p.t = m->t;
    p.e = m->e;
    p.ple = m->ple, p.pg = m->pg;
    p.router = m->router, p.route_ids = m->route_ids, p.route_w = m->route_w;
    p.logits = m->logits;
    p.prefill = &m->prefill;
    p.spec = &m->spec;
    p.dequant_elems = m->dequant_elems;
    return p;
}

extern "C" int arc_model_memory(arc_model *model, uint64_t *weights, uint64_t *kv_cache, uint64_t *activations) {
    ARC_REQUIRE(model && weights && kv_cache && activations, "null argument");
    *weights = model->weight_bytes;
    *kv_cache = model->kv.bytes;
    *activations = model->act_bytes + model->prefill.bytes + model->prefill.moe.bytes + model->spec.bytes +
                   model->dn_state_bytes + model->kv.wide_bytes;
    return ARC_OK;
}

extern "C" int arc_model_kv_planes(arc_model *model, int32_t *count, void **base, uint64_t *row_bytes,
                                   uint64_t *head_rows) {
    ARC_REQUIRE(model && count && base && row_bytes && head_rows, "null argument");
    const KvPlanes &kv = model->kv;
    *count = kv.count;
    for (int i = 0; i < kv.count; ++i) base[i] = kv.base + kv.at[i], row_bytes[i] = kv.row_bytes[i], head_rows[i] = kv.rows[i];
    return ARC_OK;
}

extern "C" int arc_model_kv_cache(arc_model *model, uint16_t **k_cache, uint16_t **v_cache) {
    ARC_REQUIRE(model && k_cache && v_cache, "null argument");
    ARC_REQUIRE(model->kv_layers > 0, "the model has no attention layer, and so no KV cache");
    ARC_REQUIRE(model->cfg.kv_cache == ARC_KV_BF16, "the KV cache is not bf16 (arc_model_kv_planes describes it)");
    *k_cache = (uint16_t *)(model->kv.base + model->kv.at[0]);
    *v_cache = (uint16_t *)(model->kv.base + model->kv.at[1]);
    return ARC_OK;
}

extern "C" int arc_model_state(arc_model *model, float **state, int32_t *layers, int32_t *slots,
                               uint64_t *slot_floats) {
    ARC_REQUIRE(model && state && layers && slots && slot_floats, "null argument");
    *layers = dn_layer_count(model->cfg);
    *state = model->dn_state;  // null when no layer keeps a state
    *slots = *layers ? DN_SLOTS : 0;
    *slot_floats = *layers ? model->dn.slot_floats : 0;
    return ARC_OK;
}
