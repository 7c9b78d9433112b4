// model.cu -- the model handle: a size table of every weight tensor (64-bit offsets into one
// device buffer), the bf16 KV cache, the float32 activations and logits; uploads; and the
// forward, enqueued on the context's stream with no allocation, no host wait and no host
// decision on device data, so that it can be captured into a graph once and replayed.
//
// Per layer the forward launches 5 kernels:
//   1 gemv         qkv = [Wq; Wk; Wv] @ rmsnorm(x, attn_norm) (+ [bq; bk; bv])
//   2 attention    rotate q and k (RoPE), k and v -> KV cache at pos (bf16), then attention over
//                  chunks of positions, the last block of a head combining them -> att
//   3 gemv         x += Wo @ att
//   4 gemv_swiglu  h = silu(Wgate @ n) * (Wup @ n), n = rmsnorm(x, mlp_norm)
//   5 gemv         x += Wdown @ h
// plus the embedding before the layers and logits = lm_head @ rmsnorm(x, final_norm) after (in the
// greedy step graph with the argmax and its commit in the same kernel: arc_model_forward_commit).
// Every kernel is launched with programmatic dependent launch (kernels.cuh: pdl_wait): the next
// one is scheduled while the previous one finishes, and waits on the device for its data. Work
// enqueued after the forward with a plain launch or a copy is ordered as usual.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.cuh"

enum { TENSOR_COUNT = ARC_TENSOR_ROPE_INV_FREQ + 1, ALIGN = 256 };

static const char *const TENSOR_NAMES[TENSOR_COUNT] = {
    "ARC_TENSOR_EMBED",  "ARC_TENSOR_ATTN_NORM", "ARC_TENSOR_WQ",         "ARC_TENSOR_WK",
    "ARC_TENSOR_WV",     "ARC_TENSOR_BQ",        "ARC_TENSOR_BK",         "ARC_TENSOR_BV",
    "ARC_TENSOR_WO",     "ARC_TENSOR_MLP_NORM",  "ARC_TENSOR_W_GATE",     "ARC_TENSOR_W_UP",
    "ARC_TENSOR_W_DOWN", "ARC_TENSOR_FINAL_NORM", "ARC_TENSOR_LM_HEAD",   "ARC_TENSOR_ROPE_INV_FREQ",
};

static bool per_layer(int t) {
    return t != ARC_TENSOR_EMBED && t != ARC_TENSOR_FINAL_NORM && t != ARC_TENSOR_LM_HEAD &&
           t != ARC_TENSOR_ROPE_INV_FREQ;
}

static bool is_bias(int t) { return t == ARC_TENSOR_BQ || t == ARC_TENSOR_BK || t == ARC_TENSOR_BV; }

struct arc_model {
    arc_context *ctx;
    arc_model_config cfg;
    int32_t q_dim, kv_dim, qkv_rows;
    // The size table: bytes of each tensor (0 when this configuration has none) and its offset
    // in `weights`; a per-layer tensor of layer l lies at offset + l * layer_stride.
    uint64_t bytes[TENSOR_COUNT];
    uint64_t offset[TENSOR_COUNT];
    uint64_t layer_stride;
    uint64_t weight_bytes;
    uint8_t *weights;
    bool *uploaded;  // host [TENSOR_COUNT][n_layers]; global tensors use layer 0
    // KV cache: k then v, each (n_layers, n_kv_heads, max_seq, head_dim) bf16.
    uint16_t *kv;
    uint64_t kv_layer_elems;
    // Activations, all float32, carved from one allocation.
    void *act;
    float *x;        // residual stream (dim)
    float *qkv;      // (q_dim + 2 * kv_dim)
    float *att;      // attention output (q_dim)
    float *h;        // swiglu output (ffn_dim)
    float *logits;   // (vocab)
    float *scratch;  // attention partials
    PrefillBuffers prefill;  // the prefill's activations, once reserved (prefill.cu)
};

static uint64_t align_up(uint64_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

// Lays out the weights. Tensors one fused GEMV reads as one matrix are adjacent with no padding
// (Wq Wk Wv, bq bk bv, Wgate Wup): each matrix's size is a multiple of 16 bytes (dim % 8 == 0),
// so the one that follows is still 16-byte aligned.
static void build_size_table(arc_model *m) {
    const arc_model_config &c = m->cfg;
    const uint64_t dim = c.dim, ffn = c.ffn_dim, vocab = c.vocab, q = m->q_dim, kv = m->kv_dim;
    uint64_t at = 0;
    auto place = [&](int t, uint64_t n_bytes) {
        at = align_up(at);
        m->offset[t] = at;
        m->bytes[t] = n_bytes;
        at += n_bytes;
    };
    auto follow = [&](int t, uint64_t n_bytes) {
        m->offset[t] = at;
        m->bytes[t] = n_bytes;
        at += n_bytes;
    };
    place(ARC_TENSOR_EMBED, vocab * dim * 2);
    place(ARC_TENSOR_FINAL_NORM, dim * 2);
    if (!c.tied_embeddings) place(ARC_TENSOR_LM_HEAD, vocab * dim * 2);
    place(ARC_TENSOR_ROPE_INV_FREQ, (uint64_t)(c.head_dim / 2) * 4);
    const uint64_t layer0 = align_up(at);
    at = 0;  // per-layer offsets are relative to layer0 until the end
    place(ARC_TENSOR_ATTN_NORM, dim * 2);
    place(ARC_TENSOR_WQ, q * dim * 2);
    follow(ARC_TENSOR_WK, kv * dim * 2);
    follow(ARC_TENSOR_WV, kv * dim * 2);
    if (c.qkv_bias) {
        place(ARC_TENSOR_BQ, q * 2);
        follow(ARC_TENSOR_BK, kv * 2);
        follow(ARC_TENSOR_BV, kv * 2);
    }
    place(ARC_TENSOR_WO, dim * q * 2);
    place(ARC_TENSOR_MLP_NORM, dim * 2);
    place(ARC_TENSOR_W_GATE, ffn * dim * 2);
    follow(ARC_TENSOR_W_UP, ffn * dim * 2);
    place(ARC_TENSOR_W_DOWN, dim * ffn * 2);
    m->layer_stride = align_up(at);
    for (int t = 0; t < TENSOR_COUNT; ++t)
        if (per_layer(t) && m->bytes[t] != 0) m->offset[t] += layer0;
    m->weight_bytes = layer0 + m->layer_stride * (uint64_t)c.n_layers;
}

static uint8_t *tensor_at(const arc_model *m, int t, int layer) {
    return m->weights + m->offset[t] + (per_layer(t) ? (uint64_t)layer * m->layer_stride : 0);
}
static const uint16_t *bf16_at(const arc_model *m, int t, int layer) {
    return reinterpret_cast<const uint16_t *>(tensor_at(m, t, layer));
}

static int check_config(const arc_model_config *c) {
    ARC_REQUIRE(c->dim > 0 && c->dim % 8 == 0 && c->dim <= GEMV_MAX_COLS,
                "config.dim must be a multiple of 8 in [8, %d], got %d", GEMV_MAX_COLS, c->dim);
    ARC_REQUIRE(c->n_layers > 0, "config.n_layers must be positive, got %d", c->n_layers);
    ARC_REQUIRE(c->n_heads > 0, "config.n_heads must be positive, got %d", c->n_heads);
    ARC_REQUIRE(c->n_kv_heads > 0, "config.n_kv_heads must be positive, got %d", c->n_kv_heads);
    ARC_REQUIRE(c->n_heads % c->n_kv_heads == 0, "config.n_heads (%d) must be a multiple of n_kv_heads (%d)",
                c->n_heads, c->n_kv_heads);
    ARC_REQUIRE(c->head_dim > 0 && c->head_dim % 2 == 0 && c->head_dim <= ATTN_MAX_HEAD_DIM,
                "config.head_dim must be even and in [2, %d], got %d", ATTN_MAX_HEAD_DIM, c->head_dim);
    const long long q_dim = (long long)c->n_heads * c->head_dim;
    ARC_REQUIRE(q_dim % 8 == 0 && q_dim <= GEMV_MAX_COLS,
                "config.n_heads * head_dim must be a multiple of 8 and at most %d, got %lld", GEMV_MAX_COLS, q_dim);
    ARC_REQUIRE(c->ffn_dim > 0 && c->ffn_dim % 8 == 0 && c->ffn_dim <= GEMV_MAX_COLS,
                "config.ffn_dim must be a multiple of 8 in [8, %d], got %d", GEMV_MAX_COLS, c->ffn_dim);
    ARC_REQUIRE(c->vocab > 0, "config.vocab must be positive, got %d", c->vocab);
    ARC_REQUIRE(c->max_seq > 0 && c->max_seq <= ATTN_MAX_SEQ, "config.max_seq must be in [1, %d], got %d",
                ATTN_MAX_SEQ, c->max_seq);
    ARC_REQUIRE(c->rms_eps > 0.0f && isfinite(c->rms_eps), "config.rms_eps must be positive and finite, got %g",
                (double)c->rms_eps);
    ARC_REQUIRE(c->tied_embeddings == 0 || c->tied_embeddings == 1,
                "config.tied_embeddings must be 0 or 1, got %d", c->tied_embeddings);
    ARC_REQUIRE(c->qkv_bias == 0 || c->qkv_bias == 1, "config.qkv_bias must be 0 or 1, got %d", c->qkv_bias);
    return ARC_OK;
}

static void model_release(arc_model *m) {
    if (m->weights) cudaFree(m->weights);
    if (m->kv) cudaFree(m->kv);
    if (m->act) cudaFree(m->act);
    prefill_buffers_release(&m->prefill);
    free(m->uploaded);
    free(m);
}

// Allocates the weights, the KV cache (zeroed) and the activations; on failure the caller
// releases the partial model.
static int model_init(arc_model *m) {
    arc_context *ctx = m->ctx;
    const arc_model_config &c = m->cfg;
    m->uploaded = (bool *)calloc((size_t)TENSOR_COUNT * c.n_layers, sizeof(bool));
    if (!m->uploaded) return arc_fail(ARC_OUT_OF_MEMORY, "arc_model_create", "host allocation failed");
    build_size_table(m);
    ARC_CUDA(ctx, cudaMalloc(&m->weights, m->weight_bytes));

    m->kv_layer_elems = (uint64_t)c.n_kv_heads * c.max_seq * c.head_dim;
    const uint64_t kv_bytes = 2 * m->kv_layer_elems * c.n_layers * sizeof(uint16_t);
    ARC_CUDA(ctx, cudaMalloc(&m->kv, kv_bytes));
    // Positions not yet written are never read; zeros keep a stray read finite and repeatable.
    ARC_CUDA(ctx, cudaMemsetAsync(m->kv, 0, kv_bytes, ctx->stream));

    uint64_t at = 0, off[6];
    const uint64_t sizes[6] = {
        (uint64_t)c.dim * 4,
        (uint64_t)m->qkv_rows * 4,
        (uint64_t)m->q_dim * 4,
        (uint64_t)c.ffn_dim * 4,
        (uint64_t)c.vocab * 4,
        arc_attention_scratch_bytes(c.n_heads, c.head_dim, c.max_seq),
    };
    for (int i = 0; i < 6; ++i) {
        off[i] = at;
        at = align_up(at + sizes[i]);
    }
    ARC_CUDA(ctx, cudaMalloc(&m->act, at));
    ARC_CUDA(ctx, cudaMemsetAsync(m->act, 0, at, ctx->stream));
    uint8_t *base = (uint8_t *)m->act;
    m->x = (float *)(base + off[0]);
    m->qkv = (float *)(base + off[1]);
    m->att = (float *)(base + off[2]);
    m->h = (float *)(base + off[3]);
    m->logits = (float *)(base + off[4]);
    m->scratch = (float *)(base + off[5]);
    return ARC_OK;
}

extern "C" int arc_model_create(arc_context *ctx, const arc_model_config *config, arc_model **out) {
    ARC_REQUIRE(ctx && config && out, "null argument");
    *out = nullptr;
    ARC_REQUIRE(!ctx->capturing, "a model cannot be created while a graph is being captured");
    int st = check_config(config);
    if (st != ARC_OK) return st;
    arc_model *m = (arc_model *)calloc(1, sizeof *m);
    if (!m) return arc_fail(ARC_OUT_OF_MEMORY, __func__, "host allocation failed");
    m->ctx = ctx;
    m->cfg = *config;
    m->q_dim = config->n_heads * config->head_dim;
    m->kv_dim = config->n_kv_heads * config->head_dim;
    m->qkv_rows = m->q_dim + 2 * m->kv_dim;
    st = model_init(m);
    if (st != ARC_OK) {
        model_release(m);
        return st;
    }
    *out = m;
    return ARC_OK;
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
    const char *name = TENSOR_NAMES[tensor];
    if (per_layer(tensor))
        ARC_REQUIRE(layer >= 0 && layer < c.n_layers, "%s is a per-layer tensor: layer must be in [0, %d), got %d",
                    name, c.n_layers, layer);
    else
        ARC_REQUIRE(layer == 0, "%s is a global tensor: layer must be 0, got %d", name, layer);
    ARC_REQUIRE(!is_bias(tensor) || c.qkv_bias, "%s: the model was created without q/k/v biases (qkv_bias = 0)",
                name);
    ARC_REQUIRE(tensor != ARC_TENSOR_LM_HEAD || !c.tied_embeddings,
                "%s: the model ties the lm_head to the embedding (tied_embeddings = 1)", name);
    ARC_REQUIRE(bytes == model->bytes[tensor], "%s (layer %d) takes exactly %llu bytes, got %llu", name, layer,
                (unsigned long long)model->bytes[tensor], (unsigned long long)bytes);
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
        if (m->bytes[t] == 0) continue;  // absent in this configuration
        const int layers = per_layer(t) ? c.n_layers : 1;
        for (int l = 0; l < layers; ++l) {
            if (m->uploaded[t * c.n_layers + l]) continue;
            if (per_layer(t))
                return arc_fail(ARC_INVALID_ARGUMENT, who, "%s of layer %d was never uploaded (arc_model_upload)",
                                TENSOR_NAMES[t], l);
            return arc_fail(ARC_INVALID_ARGUMENT, who, "%s was never uploaded (arc_model_upload)", TENSOR_NAMES[t]);
        }
    }
    return ARC_OK;
}

// The size table keeps Wq Wk Wv (and bq bk bv, and Wgate Wup) adjacent, so each group is read
// as one matrix from its first member.
LayerParts model_layer(const arc_model *m, int l) {
    LayerParts p;
    p.attn_norm = bf16_at(m, ARC_TENSOR_ATTN_NORM, l);
    p.wqkv = bf16_at(m, ARC_TENSOR_WQ, l);
    p.bqkv = m->cfg.qkv_bias ? bf16_at(m, ARC_TENSOR_BQ, l) : nullptr;
    p.wo = bf16_at(m, ARC_TENSOR_WO, l);
    p.mlp_norm = bf16_at(m, ARC_TENSOR_MLP_NORM, l);
    p.w_gate_up = bf16_at(m, ARC_TENSOR_W_GATE, l);
    p.w_down = bf16_at(m, ARC_TENSOR_W_DOWN, l);
    p.k_cache = m->kv + (uint64_t)l * m->kv_layer_elems;
    p.v_cache = m->kv + (uint64_t)(m->cfg.n_layers + l) * m->kv_layer_elems;
    return p;
}

ModelParts model_parts(arc_model *m) {
    const arc_model_config &c = m->cfg;
    ModelParts p;
    p.ctx = m->ctx;
    p.cfg = c;
    p.q_dim = m->q_dim;
    p.kv_dim = m->kv_dim;
    p.qkv_rows = m->qkv_rows;
    p.embed = bf16_at(m, ARC_TENSOR_EMBED, 0);
    p.final_norm = bf16_at(m, ARC_TENSOR_FINAL_NORM, 0);
    p.lm_head = bf16_at(m, c.tied_embeddings ? ARC_TENSOR_EMBED : ARC_TENSOR_LM_HEAD, 0);
    p.inv_freq = reinterpret_cast<const float *>(tensor_at(m, ARC_TENSOR_ROPE_INV_FREQ, 0));
    p.logits = m->logits;
    p.prefill = &m->prefill;
    return p;
}

// The forward; with commit, its lm_head takes the argmax and commits it to the loop.
static int forward(arc_model *model, arc_loop *loop, bool commit, const char *who) {
    ARC_REQUIRE_AS(who, model && loop, "null argument");
    arc_context *ctx = model->ctx;
    const arc_model_config &c = model->cfg;
    ARC_REQUIRE_AS(who, loop->ctx == ctx, "the loop and the model belong to different contexts");
    ARC_REQUIRE_AS(who, loop->vocab <= c.vocab, "the loop's vocab %d exceeds the model's %d", loop->vocab, c.vocab);
    ARC_REQUIRE_AS(who, loop->max_seq <= c.max_seq, "the loop's max_seq %d exceeds the model's %d",
                   loop->max_seq, c.max_seq);
    ARC_TRY(model_check_uploaded(model, who));
    const uint32_t *token = nullptr;
    const int32_t *pos = nullptr;
    ARC_TRY(arc_loop_token_input(loop, &token, &pos));

    // Shapes, activations and the global weights, named as the calls below use them.
    const int32_t dim = c.dim, ffn_dim = c.ffn_dim, vocab = c.vocab, max_seq = c.max_seq;
    const int32_t n_heads = c.n_heads, n_kv_heads = c.n_kv_heads, hd = c.head_dim;
    const int32_t q_dim = model->q_dim, qkv_rows = model->qkv_rows;
    const float eps = c.rms_eps;
    float *x = model->x, *qkv = model->qkv, *att = model->att, *h = model->h;
    float *scratch = model->scratch, *logits = model->logits;
    const ModelParts parts = model_parts(model);
    const uint16_t *embed = parts.embed, *final_norm = parts.final_norm, *lm_head = parts.lm_head;
    const float *inv_freq = parts.inv_freq;
    const uint16_t *no_bias = nullptr, *no_norm = nullptr;

    // x = embed[token]
    ARC_TRY(arc_op_embedding(ctx, embed, vocab, dim, token, x));
    for (int l = 0; l < c.n_layers; ++l) {
        const LayerParts lw = model_layer(model, l);
        const uint16_t *attn_norm = lw.attn_norm, *wqkv = lw.wqkv, *bqkv = lw.bqkv, *wo = lw.wo;
        const uint16_t *mlp_norm = lw.mlp_norm, *w_gate_up = lw.w_gate_up, *w_down = lw.w_down;
        uint16_t *k_cache = lw.k_cache, *v_cache = lw.v_cache;

        // qkv = [Wq; Wk; Wv] @ rmsnorm(x, attn_norm) (+ [bq; bk; bv])
        ARC_TRY(arc_op_gemv(ctx, wqkv, x, qkv_rows, dim, bqkv, attn_norm, eps, /*accumulate=*/0, qkv));
        // q, k rotated at pos; k, v -> cache at pos; att = softmax(q k^T / sqrt(hd)) v over 0..pos
        ARC_TRY(arc_op_attention(ctx, qkv, inv_freq, k_cache, v_cache, n_heads, n_kv_heads, hd, max_seq, pos,
                                 scratch, att));
        // x += Wo @ att
        ARC_TRY(arc_op_gemv(ctx, wo, att, dim, q_dim, no_bias, no_norm, /*eps=*/0.0f, /*accumulate=*/1, x));
        // h = silu(Wgate @ n) * (Wup @ n), n = rmsnorm(x, mlp_norm)
        ARC_TRY(arc_op_gemv_swiglu(ctx, w_gate_up, x, ffn_dim, dim, mlp_norm, eps, h));
        // x += Wdown @ h
        ARC_TRY(arc_op_gemv(ctx, w_down, h, dim, ffn_dim, no_bias, no_norm, /*eps=*/0.0f, /*accumulate=*/1, x));
    }
    // logits = lm_head @ rmsnorm(x, final_norm); with commit, their argmax -> the loop
    if (commit)
        return launch_gemv_argmax(ctx, who, lm_head, x, vocab, dim, final_norm, eps, logits, loop, nullptr, nullptr);
    ARC_TRY(arc_op_gemv(ctx, lm_head, x, vocab, dim, no_bias, final_norm, eps, /*accumulate=*/0, logits));
    return ARC_OK;
}

extern "C" int arc_model_forward(arc_model *model, arc_loop *loop) { return forward(model, loop, false, __func__); }

extern "C" int arc_model_forward_commit(arc_model *model, arc_loop *loop) {
    return forward(model, loop, true, __func__);
}

extern "C" int arc_model_logits(arc_model *model, const float **logits, int32_t *vocab) {
    ARC_REQUIRE(model && logits && vocab, "null argument");
    *logits = model->logits;
    *vocab = model->cfg.vocab;
    return ARC_OK;
}
