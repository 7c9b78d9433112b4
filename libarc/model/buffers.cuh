// buffers.cuh -- the activations of the forwards beyond the decode step's, each one allocation
// an arc_model holds (model.cu), all zero until reserved: the prefill's (prefill.cu), with a
// mixture of experts' routed rows (moe.cu), and the speculative step's (speculate.cu).
#pragma once

#include "model/parts.cuh"

// A mixture of experts' rows in the prefill (moe.cu), for chunks of up to `rows` tokens of k
// experts each: the routing, the rows sorted by expert, and what the experts make of them.
struct MoeRows {
    void *mem;
    uint64_t bytes;
    int32_t rows;
    float *logits;      // (rows, n_experts + 1): the router's, then the shared expert's gate
    int32_t *ids;       // (rows, k): each row's experts, in order of choice
    float *weights;     // (rows, k + 1): their weights, then the shared expert's sigmoid
    int32_t *offsets;   // (n_experts + 1): expert e's rows are sorted rows offsets[e]..offsets[e + 1]
    int32_t *order;     // (rows k): the token a sorted row belongs to
    int32_t *slot_row;  // (rows, k): the sorted row of each token's j-th expert
    uint16_t *h;        // (rows k, expert_ffn_dim) bf16: the experts' GLUs, sorted
    float *y;           // (rows k, dim): the experts' down projections, sorted
    uint16_t *sh;       // (rows, shared_ffn_dim) bf16: the shared expert's GLU
    float *sy;          // (rows, dim): its down projection
};

// The prefill's activations for chunks of up to max_chunk tokens, one allocation (prefill.cu);
// an arc_model holds one, all zero until arc_model_prefill_reserve.
struct PrefillBuffers {
    void *mem;
    uint64_t bytes;
    int32_t max_chunk;
    float *x;       // residual stream (max_chunk, dim)
    uint16_t *xn;   // normed input of a product, bf16 (max_chunk, dim)
    float *qkv;     // (max_chunk, q_dim + 2 * kv_dim), or a prompt's scores (score_rows of them)
    uint16_t *q;    // rotated queries, bf16 (max_chunk, q_dim)
    uint16_t *att;  // attention output, bf16 (max_chunk, q_dim)
    uint16_t *h;    // SwiGLU output, bf16 (max_chunk, ffn_dim)
    uint16_t *wdq;  // a quantized matrix dequantized for its product, bf16 (the model's dequant_elems)
    float *gu;      // where the gate/up product runs on gemm_sm90.cu: (gu_rows, 2 ffn_dim) float32
    int32_t gu_rows, score_rows;
    float *t;       // with post_norms: a product's output before its norm (max_chunk, dim) float32
    float *attn_part;  uint64_t attn_part_n;  // the attention's partials (prefill_attention.cu), floats
    MoeRows moe;    // a mixture of experts' (its own allocation; none for a dense model)
    float *ple, *pg;  // with ple_dim: the rows' per-layer inputs (max_chunk, n_layers * ple_dim), a gate's (max_chunk, ple_dim)
    uint16_t *pgb;    // with ple_dim: the gate's rows as the next product's bf16 input (max_chunk, ple_dim)
};
// Frees what arc_model_prefill_reserve allocated (cudaFree waits: teardown and reserve only).
void prefill_buffers_release(PrefillBuffers *b);

// A speculative step's buffers for k drafts (rows = k + 1), one allocation (speculate.cu); an
// arc_model holds one, all zero until arc_model_speculate_reserve.
struct SpecBuffers {
    void *mem;
    uint64_t bytes;
    int32_t k;
    float *x;          // residual streams (rows, dim)
    float *xn;         // a product's normed or quantized input rows (rows, max(dim, q_dim, ffn_dim))
    float *h;          // the GLU output (rows, ffn_dim)
    float *qkv;        // (rows, q_dim + 2 kv_dim)
    float *att;        // (rows, q_dim)
    float *attn_scratch;  // the attention's partials, rows times arc_attention_scratch_bytes
    unsigned *attn_done;  // its tickets (rows, n_heads)
    float *logits;     // (rows, vocab)
    float *t;          // with post_norms: a product's output before its norm (rows, dim)
    int32_t *tokens;   // the rows' tokens (rows), then the number of drafts
    int32_t *positions;  // (rows)
    unsigned long long *keys;  // each row's argmax key (head_argmax.cuh's argmax_key), then each row's ~low key
    float *ple, *pg;   // with ple_dim: the rows' per-layer inputs (rows, n_layers * ple_dim), a gate's (rows, ple_dim)
};
void spec_buffers_release(SpecBuffers *b);
