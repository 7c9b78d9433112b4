// speculate.cu -- the speculative step: more than one token per read of the weights, decided on
// the device, so the loop's host still only enqueues steps and reads the ring.
//
// One step, all of it captured once into a graph:
//   1 draft        the latest earlier occurrence of the sequence's last n tokens (n = ngram down
//                  to 1) in the loop's history or its memory of earlier sequences; the k
//                  tokens that followed it are the drafts (the stretch from the match to the
//                  current token repeated, where it is shorter; a remembered sequence's end ends them)
//   2 the verify forward over rows [token, drafts] at positions p..p+k, every weight read once:
//                  each layer's program (layer.cuh) as the verify runs its ops, each row through
//                  the decode's kernels or their form over rows (gemv_rows.cu: the GEMVs;
//                  verify_attention.cu: the cache rows, then the decode's attention over every
//                  row), so each row's logits are the decode step's at its position, bit for bit;
//                  then the lm_head over every row
//   3 argmax       each row's argmax key (one atomic max a block); in the sampled step
//                  (arc_model_forward_speculate_draw) instead the draw after each row, at that
//                  row's position, with the loop's sampling parameters (sample.cu: the same draw,
//                  the same Philox counter, as the plain sampled step's at that position)
//   4 accept       commits the token after row 0, and after row i + 1 while draft i + 1 equals
//                  the token after row i: each published token is what the model makes after the
//                  tokens before it, greedy or drawn. The commit's checks (range, position,
//                  non-finite, stop ids, the burst's limit) apply to each; a stop id ends the run.
//                  Then the step count.
// Rejected rows leave cache rows past the new position; the next step's rows overwrite them
// before any attention reads them.
#include <algorithm>

#include "commit.cuh"
#include "layer.cuh"
#include "model/attention_ops.cuh"
#include "model/buffers.cuh"
#include "model/embedding.cuh"
#include "model/gemv/head_argmax.cuh"
#include "model/norms.cuh"
#include "model/ple.cuh"
#include "model/products.cuh"
#include "model/scales.cuh"
#include "sample.cuh"

enum { DRAFT_THREADS = 1024, SPEC_MAX_K = 7, SPEC_MAX_NGRAM = 8, ROWMAX_THREADS = 256, ROWMAX_BLOCKS = 32 };

void spec_buffers_release(SpecBuffers *b) {
    if (b->mem) cudaFree(b->mem);
    *b = SpecBuffers{};
}

// The draft: writes the rows' tokens (the current token, then up to k drafts, padded with the
// current token), their positions, the number of drafts, and clears the argmax keys. The candidate
// ends j run over the memory of earlier sequences (history[-memory..-1], a negative id between
// two) and the history before p; a match never spans a separator. The longest match wins, then the
// latest: one key per candidate, (match length << 32) | (j + ARC_DRAFT_MEMORY). Drafts from the
// memory stop at its next separator.
__global__ void __launch_bounds__(DRAFT_THREADS)
draft_kernel(DeviceState *st, int32_t *__restrict__ history, int k, int ngram, int32_t *tokens, int32_t *positions,
             unsigned long long *keys) {
    __shared__ unsigned long long wbest[DRAFT_THREADS / 32];
    pdl_launch_dependents();
    pdl_wait();
    const int p = st->position, tid = threadIdx.x, memory = st->memory;
    const int32_t tok = (int32_t)st->token;
    unsigned long long best = 0;
    for (int j = tid - memory; j < p; j += DRAFT_THREADS) {
        int len = 0;
        // history[p] is the current token (the commit or the prompt wrote it); compare with tok.
        for (; len < ngram && j - len >= -memory; ++len) {
            const int32_t h = history[j - len];
            if (h < 0 || h != (len == 0 ? tok : history[p - len])) break;
        }
        if (len > 0) {
            const unsigned long long key = (unsigned long long)len << 32 | (uint32_t)(j + ARC_DRAFT_MEMORY);
            best = key > best ? key : best;
        }
    }
    for (int off = 16; off > 0; off /= 2) {
        const unsigned long long o = __shfl_down_sync(0xffffffffu, best, off);
        best = o > best ? o : best;
    }
    if (tid % 32 == 0) wbest[tid / 32] = best;
    __syncthreads();
    if (tid != 0) return;
    for (int w = 1; w < DRAFT_THREADS / 32; ++w) best = wbest[w] > best ? wbest[w] : best;
    int n = 0;
    if (best != 0) {  // what followed the match, repeated with its period p - j where it runs out
        const int j = (int)(uint32_t)best - ARC_DRAFT_MEMORY;
        for (; n < k; ++n) {
            const int32_t t = history[j + 1 + n % (p - j)];
            if (t < 0) break;  // the end of a remembered sequence
            tokens[1 + n] = t;
        }
    }
    for (int i = n; i < k; ++i) tokens[1 + i] = tok;
    tokens[0] = tok;
    tokens[k + 1] = n;
    for (int i = 0; i <= k; ++i) {
        positions[i] = p + i;
        keys[i] = 0;
        keys[k + 1 + i] = 0;
    }
}

// x[i] = float(embed[tokens[i]]), one block a row.
__global__ void __launch_bounds__(256)
verify_embed_kernel(const uint16_t *__restrict__ table, int vocab, int dim, const int32_t *tokens, float scale,
                    float *x) {
    pdl_launch_dependents();
    pdl_wait();
    embed_row(table, vocab, dim, (uint32_t)tokens[blockIdx.x], scale, x + (size_t)blockIdx.x * dim, 256);
}

// keys[row] = the argmax key of logits[row] (width values), and keys[rows + row] the largest ~key
// of its logits (the smallest logit's: flat logits where the two meet): blocks stride over the
// row, each adds its own by atomic maxima (the result does not depend on the order).
__global__ void __launch_bounds__(ROWMAX_THREADS)
rowmax_kernel(const float *__restrict__ logits, int width, unsigned long long *keys) {
    __shared__ unsigned long long wbest[ROWMAX_THREADS / 32];
    __shared__ uint32_t wlow[ROWMAX_THREADS / 32];
    pdl_launch_dependents();
    pdl_wait();
    const int row = blockIdx.y;
    const float *x = logits + (size_t)row * width;
    ArgmaxSeen seen;
    for (int i = blockIdx.x * ROWMAX_THREADS + threadIdx.x; i < width; i += gridDim.x * ROWMAX_THREADS)
        seen.see(x[i], i);
    unsigned long long best = seen.best;
    for (int off = 16; off > 0; off /= 2) {
        const unsigned long long o = __shfl_down_sync(0xffffffffu, best, off);
        best = o > best ? o : best;
    }
    uint32_t low = __reduce_max_sync(0xffffffffu, seen.low);
    if (threadIdx.x % 32 == 0) {
        wbest[threadIdx.x / 32] = best;
        wlow[threadIdx.x / 32] = low;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < ROWMAX_THREADS / 32; ++w) {
        best = wbest[w] > best ? wbest[w] : best;
        low = wlow[w] > low ? wlow[w] : low;
    }
    atomicMax(&keys[row], best);
    atomicMax(&keys[gridDim.y + row], (unsigned long long)low);
}

// The accept and its commits (one thread), then the step count: after the tokens, so a host that
// sees the count sees every token of the step.
__global__ void accept_kernel(CommitArgs c, const int32_t *tokens, const unsigned long long *keys, int k) {
    pdl_wait();
    if (commit_lost(c)) return;
    const int drafted = tokens[k + 1];
    for (int i = 0; i <= k; ++i) {
        const unsigned long long key = keys[i];
        const uint32_t ok = (uint32_t)(key >> 32);
        const int tok = (int)~(uint32_t)key;
        const float value = ok == 0xffffffffu ? quiet_nan() : key_value(ok);
        if (!publish_token(c, tok, value, ok == ~(uint32_t)keys[k + 1 + i])) break;
        if (i >= drafted || tokens[i + 1] != tok) break;  // draft i + 1 was not what the model made
    }
    DeviceState *st = c.st;
    st->steps += 1;
    __threadfence_system();
    c.ring->steps = st->steps;
}

extern "C" int arc_model_speculate_reserve(arc_model *model, int32_t k) {
    ARC_REQUIRE(model, "model is null");
    const ModelParts mp = model_parts(model);
    const arc_model_config &c = mp.cfg;
    arc_context *ctx = mp.ctx;
    ARC_REQUIRE(k >= 0 && k <= SPEC_MAX_K, "k must be in 0..%d, got %d", SPEC_MAX_K, k);
    ARC_REQUIRE(!ctx->capturing, "the speculative step's buffers cannot be reserved while a graph is being captured");
    SpecBuffers *b = mp.spec;
    if (k == 0) {
        spec_buffers_release(b);
        return ARC_OK;
    }
    ARC_REQUIRE(c.n_experts == 0, "speculative steps do not route a mixture of experts' rows yet");
    ARC_REQUIRE(!ctx->comm, "speculative steps do not run on a split model yet (tensor parallelism)");
    const uint64_t rows = (uint64_t)k + 1;
    enum { N = 14 };
    static_assert(SPEC_MAX_K + 1 < DN_SLOTS, "a DeltaNet layer keeps a state for each verify row");
    const uint64_t widest = (uint64_t)std::max({c.dim, mp.dn.att_dim, mp.most_ffn});  // a product's input
    const uint64_t sizes[N] = {rows * c.dim * 4, rows * widest * 4, rows * mp.most_ffn * 4, rows * mp.dn.qkv_alloc * 4,
                               rows * mp.dn.att_dim * 4, rows * c.vocab * 4, (rows + 1) * 4, rows * 4, rows * 16,
                               c.post_norms ? rows * c.dim * 4 : 0,
                               rows * arc_attention_scratch_bytes(c.n_heads, mp.most.hd, c.max_seq),
                               rows * c.n_heads * 4, rows * c.n_layers * c.ple_dim * 4, rows * c.ple_dim * 4};
    uint64_t off[N], at = 0;
    for (int i = 0; i < N; ++i) {
        off[i] = at;
        at = (at + sizes[i] + 255) / 256 * 256;
    }
    void *mem = nullptr;
    ARC_CUDA(ctx, cudaMalloc(&mem, at));  // on failure the old reservation stands
    spec_buffers_release(b);
    uint8_t *base = (uint8_t *)mem;
    b->mem = mem;
    b->bytes = at;
    b->k = k;
    b->x = (float *)(base + off[0]);
    b->xn = (float *)(base + off[1]);
    b->h = (float *)(base + off[2]);
    b->qkv = (float *)(base + off[3]);
    b->att = (float *)(base + off[4]);
    b->logits = (float *)(base + off[5]);
    b->tokens = (int32_t *)(base + off[6]);
    b->positions = (int32_t *)(base + off[7]);
    b->keys = (unsigned long long *)(base + off[8]);
    b->t = c.post_norms ? (float *)(base + off[9]) : nullptr;
    b->attn_scratch = (float *)(base + off[10]);
    b->attn_done = (unsigned *)(base + off[11]);
    b->ple = c.ple_dim ? (float *)(base + off[12]) : nullptr;
    b->pg = c.ple_dim ? (float *)(base + off[13]) : nullptr;
    ARC_CUDA(ctx, cudaMemsetAsync(mem, 0, at, ctx->stream));
    return ARC_OK;
}

// The verify's form of each op: the step's rows, each through the decode's kernels or their rows
// form, which gives each row the decode's bits (gemv_rows.cu, attention.cu's ROWS).
struct VerifyOps {
    const ModelParts &p;
    const SpecBuffers &b;
    int rows;
    static constexpr const char *who = "arc_model_forward_speculate";

    // y (rows, io.rows; io.ldy apart, io.rows where 0) = W @ n(x) (+ bias) (+ y), as gemv_rows_weight
    // says: io names x, rows, cols, bias, norm_weight, accumulate or act, y (and ldy); the step's
    // rows, the config's norm factors and the scratch are the verify's.
    int product(const Weight &w, GemvIo io, bool gated = false) const {
        io.m = rows;
        io.eps = p.cfg.rms_eps;
        io.norm_add = norm_offset(p.cfg);
        io.scratch = b.xn;
        if (io.ldy == 0) io.ldy = io.rows;
        return gemv_rows_weight(p.ctx, who, w, io, gated);
    }
    // The decode's products: one a run of parts of one format, rows `stride` floats apart.
    int in_product(const InParts &in, const uint16_t *bias, const uint16_t *norm, int32_t stride) {
        return part_runs(in, [&](Weight w, int32_t n, int32_t at) {
            return product(w, {.x = b.x, .rows = n, .cols = p.cfg.dim, .bias = bias ? bias + at : nullptr,
                               .norm_weight = norm, .y = b.qkv + at, .ldy = stride});
        });
    }
    int attn_in(const LayerParts &lw) {
        return in_product(attn_in_parts(p.cfg, lw), lw.bqkv, lw.attn_norm, lw.dims.qkv_rows);
    }
    int attn_gate(const LayerParts &lw) {
        const AttnDims &d = lw.dims;
        return launch_attn_gate(p.ctx, b.att, nullptr, b.qkv + d.q_dim + 2 * d.kv_dim, d.qkv_rows, rows, d.q_dim);
    }
    int dn_in(const LayerParts &lw) {
        return in_product(dn_in_parts(p.cfg, p.dn, lw), nullptr, lw.attn_norm, p.dn.rows);
    }
    // Every row keeps its state: the next step reads the accepted row's.
    int dn_step(const LayerParts &lw) {
        return deltanet_layer(p.ctx, p.cfg, p.dn, lw,
                              {.u = b.qkv, .rows = rows, .pos = b.positions, .every_state = true, .out = b.att});
    }
    int dn_out(const LayerParts &lw) {
        return product(lw.dn_out, {.x = b.att, .rows = p.cfg.dim, .cols = p.dn.v_dim, .accumulate = 1, .y = b.x});
    }
    int qk_norm(const LayerParts &lw) { return launch_head_norm(p.ctx, head_norm_args(p.cfg, lw, b.qkv, rows)); }
    int attend(const LayerParts &lw) {
        const arc_model_config &c = p.cfg;
        return launch_verify_attention(p.ctx, b.qkv, rows, lw.dims.qkv_rows, b.positions, layer_attn(c, lw), lw.kv,
                                       c.n_heads, lw.dims.n_kv, lw.dims.hd, c.max_seq, b.attn_scratch,
                                       b.attn_done, b.att);
    }
    int attn_out(const LayerParts &lw) {
        return product(lw.wo, {.x = b.att, .rows = p.cfg.dim, .cols = lw.dims.q_dim, .bias = lw.bo, .accumulate = 1,
                               .y = b.x});
    }
    int ffn_in(const LayerParts &lw) {
        return product(lw.w_gate_up,
                       {.x = b.x, .rows = lw.ffn, .cols = p.cfg.dim, .norm_weight = lw.mlp_norm,
                        .act = p.cfg.activation, .y = b.h},
                       /*gated=*/true);
    }
    int ffn_out(const LayerParts &lw) {
        return product(lw.w_down, {.x = b.h, .rows = p.cfg.dim, .cols = lw.ffn, .accumulate = 1, .y = b.x});
    }
    int attn_out_norm(const LayerParts &lw) {
        ARC_TRY(product(lw.wo, {.x = b.att, .rows = p.cfg.dim, .cols = lw.dims.q_dim, .y = b.t}));
        return launch_add_norm_rows(p.ctx, b.x, b.t, rows, p.cfg.dim, model_norm(p.cfg, lw.post_attn_norm));
    }
    int ffn_out_norm(const LayerParts &lw) {
        ARC_TRY(product(lw.w_down, {.x = b.h, .rows = p.cfg.dim, .cols = lw.ffn, .y = b.t}));
        return launch_add_norm_rows(p.ctx, b.x, b.t, rows, p.cfg.dim, model_norm(p.cfg, lw.post_ffn_norm));
    }
    // A mixture of experts has no speculative buffers (arc_model_speculate_reserve refuses it).
    int moe_in(const LayerParts &) { return arc_fail(ARC_INVALID_ARGUMENT, who, "no MoE verify"); }
    int moe_out(const LayerParts &) { return moe_in(LayerParts{}); }
    int experts_beside(const LayerParts &) { return moe_in(LayerParts{}); }
    int layer_scalar(const LayerParts &lw) { return launch_scale_rows(p.ctx, b.x, rows, p.cfg.dim, lw.layer_scalar); }
    int per_layer_input(const LayerParts &lw) {
        const arc_model_config &c = p.cfg;
        ARC_TRY(product(lw.ple_gate, {.x = b.x, .rows = c.ple_dim, .cols = c.dim, .y = b.pg}));
        ARC_TRY(launch_ple_gate(p, b.pg, b.ple, rows, lw.layer, nullptr));
        ARC_TRY(product(lw.ple_out, {.x = b.pg, .rows = c.dim, .cols = c.ple_dim, .y = b.t}));
        return launch_add_norm_rows(p.ctx, b.x, b.t, rows, c.dim, model_norm(c, lw.ple_post_norm));
    }
};

// The verify forward over the rows the draft wrote: logits (rows, vocab).
static int verify_forward(arc_model *model, const ModelParts &mp, const SpecBuffers &b, int rows) {
    arc_context *ctx = mp.ctx;
    const arc_model_config &c = mp.cfg;
    ARC_TRY(arc_launch_pdl(ctx, "verify_embed_kernel", verify_embed_kernel, dim3(rows), dim3(256), 0, mp.embed,
                           c.vocab, c.dim, (const int32_t *)b.tokens, embed_scale(c), b.x));
    VerifyOps ops{mp, b, rows};
    if (c.ple_dim) {  // the rows' per-layer inputs, as the decode makes its row's
        ARC_TRY(ops.product(mp.ple_projection, {.x = b.x, .rows = c.n_layers * c.ple_dim, .cols = c.dim, .y = b.ple}));
        ARC_TRY(launch_ple_inputs(mp, b.ple, b.tokens, rows));
    }
    ARC_TRY(run_layers(model, mp, ops));
    ARC_TRY(ops.product(mp.lm_head,
                        {.x = b.x, .rows = c.vocab, .cols = c.dim, .norm_weight = mp.final_norm, .y = b.logits}));
    // Capped as the decode caps its logits (the same kernel, so the same bits).
    return c.final_softcap > 0.0f ? launch_softcap_rows(ctx, b.logits, rows, c.vocab, c.vocab, c.final_softcap) : ARC_OK;
}

// The speculative step; with draw, each row's token is drawn (the sampled step) instead of its argmax.
static int speculate(arc_model *model, arc_loop *loop, int32_t ngram, bool draw, const char *who) {
    ARC_REQUIRE_AS(who, model && loop, "null argument");
    const ModelParts mp = model_parts(model);
    arc_context *ctx = mp.ctx;
    const arc_model_config &c = mp.cfg;
    const SpecBuffers &b = *mp.spec;
    ARC_REQUIRE_AS(who, b.k > 0, "no speculative buffers: call arc_model_speculate_reserve first");
    ARC_REQUIRE_AS(who, !ctx->comm, "speculative steps do not run on a split model yet (tensor parallelism)");
    ARC_REQUIRE_AS(who, ngram >= 1 && ngram <= SPEC_MAX_NGRAM, "ngram must be in 1..%d, got %d", SPEC_MAX_NGRAM, ngram);
    ARC_REQUIRE_AS(who, loop->ctx == ctx, "the loop and the model belong to different contexts");
    ARC_REQUIRE_AS(who, loop->vocab <= c.vocab, "the loop's vocab %d exceeds the model's %d", loop->vocab, c.vocab);
    ARC_REQUIRE_AS(who, loop->max_seq <= c.max_seq, "the loop's max_seq %d exceeds the model's %d", loop->max_seq,
                   c.max_seq);
    ARC_TRY(model_check_uploaded(model, who));
    const int rows = b.k + 1;
    ARC_TRY(arc_launch_pdl(ctx, "draft_kernel", draft_kernel, dim3(1), dim3(DRAFT_THREADS), 0, loop->state,
                           loop->history, b.k, ngram, b.tokens, b.positions, b.keys));
    ARC_TRY(verify_forward(model, mp, b, rows));
    if (draw) {
        for (int i = 0; i < rows; ++i)
            ARC_TRY(enqueue_row_draw(loop, b.logits + (size_t)i * c.vocab, i, rows, b.keys));
    } else {
        ARC_TRY(arc_launch_pdl(ctx, "rowmax_kernel", rowmax_kernel, dim3(ROWMAX_BLOCKS, rows), dim3(ROWMAX_THREADS), 0,
                               (const float *)b.logits, c.vocab, b.keys));
    }
    const int st = arc_launch_pdl(ctx, "accept_kernel", accept_kernel, dim3(1), dim3(1), 0, commit_args(loop),
                                  (const int32_t *)b.tokens, (const unsigned long long *)b.keys, b.k);
    if (st == ARC_OK && ctx->capturing) ctx->capture_commits = loop;
    return st;
}

extern "C" int arc_model_forward_speculate(arc_model *model, arc_loop *loop, int32_t ngram) {
    return speculate(model, loop, ngram, false, __func__);
}

extern "C" int arc_model_forward_speculate_draw(arc_model *model, arc_loop *loop, int32_t ngram) {
    return speculate(model, loop, ngram, true, __func__);
}

extern "C" int arc_model_speculation(arc_model *model, const float **logits, const int32_t **tokens, int32_t *rows) {
    ARC_REQUIRE(model && logits && tokens && rows, "null argument");
    const SpecBuffers &b = *model_parts(model).spec;
    ARC_REQUIRE(b.k > 0, "no speculative buffers: call arc_model_speculate_reserve first");
    *logits = b.logits;
    *tokens = b.tokens;
    *rows = b.k + 1;
    return ARC_OK;
}
