/* arc.h -- the public C ABI of libarc, a batch-1 decode engine for Llama-family models.
 *
 * Rules of this ABI:
 *   - Every entry point returns an arc_status (0 is success) except the three that only
 *     read host memory (arc_status_string, arc_last_error, arc_abi_version).
 *   - On failure the detail (which call, which argument, CUDA error name and string) is kept
 *     per thread; arc_last_error() returns it until the next failing call on that thread.
 *   - No entry point blocks the host on the GPU. Completion is observed by polling
 *     arc_stream_query() or the host-mapped ring (arc_ring_poll); there is no synchronize.
 *   - Handles are opaque. Device pointers are plain pointers owned by the caller's handles.
 *
 * The declarations between the cdef markers are also the cffi cdef of arcpy/_lib.py; a test
 * keeps the two identical, so no macros appear between them.
 */
#ifndef ARC_H
#define ARC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* arc-cdef-begin */
typedef enum arc_status {
    ARC_OK = 0,
    ARC_NOT_READY = 1,         /* arc_stream_query: work is still running; not an error */
    ARC_INVALID_ARGUMENT = 2,  /* a null handle, a size out of range, a shape the kernel can't do */
    ARC_NO_DEVICE = 3,         /* no driver, no GPU, or the device index does not exist */
    ARC_CUDA_ERROR = 4,        /* a CUDA call failed; the detail names it */
    ARC_DEVICE_FAULT = 5,      /* a sticky asynchronous fault: the context is unusable */
    ARC_OUT_OF_MEMORY = 6,
    ARC_CAPTURE_ERROR = 7,     /* graph capture or instantiation failed */
    ARC_BUSY = 8               /* the operation needs the stream idle and it is not */
} arc_status;

/* Limits a caller sizes its arrays by. */
enum { ARC_MAX_STOP_IDS = 8 };  /* arc_sequence holds at most this many stop ids */
enum { ARC_MAX_LAYER_OPS = 8 }; /* arc_layer_program lists at most this many ops */

typedef struct arc_context arc_context;
typedef struct arc_graph arc_graph;
typedef struct arc_loop arc_loop;
typedef struct arc_model arc_model;
/* Library */
int arc_abi_version(void);
const char *arc_status_string(int status);
const char *arc_last_error(void);
int arc_device_count(int *count);
/* Context: one device, one non-blocking stream. */
int arc_context_create(int device, arc_context **out);
int arc_context_destroy(arc_context *ctx);
int arc_context_device_name(arc_context *ctx, char *buf, size_t len);
int arc_stream_query(arc_context *ctx);
/* The device's free and total memory in bytes (start-up and reports; not for the step path). */
int arc_context_memory(arc_context *ctx, uint64_t *free_bytes, uint64_t *total_bytes);

/* Memory. Host buffers are pinned and mapped (the GPU writes, the host reads with plain loads). Copies are
 * asynchronous on the stream; a device-to-host copy must target pinned memory. */
int arc_device_alloc(arc_context *ctx, uint64_t bytes, void **out);
int arc_device_free(arc_context *ctx, void *ptr);
int arc_host_alloc(arc_context *ctx, uint64_t bytes, void **host_out, void **device_out);
int arc_host_free(arc_context *ctx, void *host_ptr);
int arc_enqueue_copy_to_device(arc_context *ctx, void *dst, const void *src, uint64_t bytes);
int arc_enqueue_copy_to_host(arc_context *ctx, void *pinned_dst, const void *src, uint64_t bytes);
int arc_enqueue_copy_on_device(arc_context *ctx, void *dst, const void *src, uint64_t bytes);
/* Graphs: capture what is enqueued on the context's stream between begin and end. */
int arc_graph_capture_begin(arc_context *ctx);
int arc_graph_capture_end(arc_context *ctx, arc_graph **out);
int arc_graph_launch(arc_graph *graph);
int arc_graph_destroy(arc_graph *graph);
/* The nodes (kernels, copies, memsets) one launch replays, counted at capture end. */
int arc_graph_node_count(arc_graph *graph, uint64_t *count);

/* Counters the context keeps of its own CUDA work, for per-token accounting. */
typedef struct arc_counters {
    uint64_t cuda_calls;     /* every CUDA runtime call made on this context's behalf */
    uint64_t kernel_launches, graph_launches, stream_queries;
} arc_counters;
int arc_context_counters(arc_context *ctx, arc_counters *out);

/* The decode loop's state: the token and position the forward reads (device memory), the stop ids, the host-mapped
 * ring the commit publishes into, and the fault word. A step graph is captured once: the forward, then
 * arc_loop_enqueue_sample_commit (the argmax, whose last block commits), or arc_model_forward_commit (both in one);
 * arc_loop_enqueue_step replays it. vocab is the range of valid token ids; the logits may be wider (a padded
 * lm_head), and an argmax that lands in the padding is a fault, not a token. */
typedef struct arc_ring_state {
    uint32_t published;    /* tokens published since the ring was reset */
    uint32_t fault;        /* 0, or an arc_fault code latched by the commit kernel */
    int32_t fault_token;   /* the offending token, when fault != 0 */
    int32_t fault_pos;     /* the position it was to be written at */
    uint32_t stopped;      /* id of the last burst a stop id ended, 0 if none */
    uint32_t steps;        /* speculative steps whose commit ran since the ring was reset */
    uint32_t logprobs;     /* log-probability entries written (arc_loop_enqueue_logprobs), at most published */
} arc_ring_state;

typedef enum arc_fault {
    ARC_FAULT_NONE = 0,
    ARC_FAULT_TOKEN_RANGE = 1,     /* sampled token outside [0, vocab) */
    ARC_FAULT_POSITION_RANGE = 2,  /* the next position would reach max_seq */
    ARC_FAULT_NONFINITE = 3,       /* the winning logit is NaN or infinite: the forward broke */
    ARC_FAULT_DEGENERATE = 4,      /* every logit equal (vocab > 1): the forward carries no information */
    ARC_FAULT_MASK_TIMEOUT = 5     /* a masked step waited ARC_MASK_WAIT_US for its mask: the host wrote none */
} arc_fault;

int arc_loop_create(arc_context *ctx, int32_t vocab, int32_t max_seq, int32_t ring_capacity, arc_loop **out);
int arc_loop_destroy(arc_loop *loop);
int arc_loop_token_input(arc_loop *loop, const uint32_t **token, const int32_t **position);
int arc_loop_enqueue_sample_commit(arc_loop *loop, const float *logits, int32_t width);

/* Sampling in the loop. A second step graph captures the forward, then arc_loop_enqueue_draw_commit (the draw of
 * arc_sample below, whose chosen token the same commit publishes), reading the parameters arc_loop_begin_sequence last
 * wrote (ARC_SEQ_SAMPLING; stream-ordered, like the stop ids), so one captured graph serves every sampling request.
 * The draw is at position (the loop's position + 1): the position the drawn token takes. */
typedef struct arc_sampling {
    double temperature;  /* > 0 and finite, with 1 / temperature finite in float32 */
    double top_p;        /* in (0, 1]; 1 is off */
    int32_t top_k;       /* >= 0; 0 is off, as is any value >= the vocabulary */
    uint64_t seed;
} arc_sampling;

int arc_loop_enqueue_draw_commit(arc_loop *loop, const float *logits, int32_t width);
int arc_loop_enqueue_step(arc_loop *loop, arc_graph *step_graph, uint32_t burst_id);
/* What a step does after its forward, without the forward: the commits enqueued after arc_loop_begin_burst belong
 * to that burst, so a prompt's forward (arc_model_prefill) followed by arc_loop_enqueue_sample_commit or
 * arc_loop_enqueue_draw_commit is the first step of a burst: its token lands in the ring like every other.
 * arc_loop_enqueue_step begins its burst itself. */
int arc_loop_begin_burst(arc_loop *loop, uint32_t burst_id);
/* arc_loop_begin_burst, the burst publishing at most max_tokens (>= 1) tokens: later commits
 * publish nothing, as after a stop id (speculative steps publish a varying number each). */
int arc_loop_begin_burst_limit(arc_loop *loop, uint32_t burst_id, uint32_t max_tokens);
int arc_ring_poll(arc_loop *loop, arc_ring_state *state);
int arc_ring_read(arc_loop *loop, uint32_t first, uint32_t count, int32_t *tokens);
/* Log-probabilities in the loop. Captured after a step's sampler, arc_loop_enqueue_logprobs writes, for the token that
 * step published, its log-probability under log_softmax(logits[0..vocab)) (float32, the raw logits: no temperature or
 * truncation) and the top_n most likely ids and theirs (value descending, ties to the lower id), top_n set by
 * arc_loop_begin_sequence (ARC_SEQ_LOGPROBS: 0..ARC_MAX_TOP_LOGPROBS, stream-ordered; the first allocates the ring). A
 * step that published nothing writes nothing. arc_ring_read_logprobs copies entries [first, first + count) once
 * arc_ring_state.logprobs covers them: logprob[count], top_ids and top_values [count][ARC_MAX_TOP_LOGPROBS]. */
enum { ARC_MAX_TOP_LOGPROBS = 20 };
int arc_loop_enqueue_logprobs(arc_loop *loop, const float *logits, int32_t width);
int arc_ring_read_logprobs(arc_loop *loop, uint32_t first, uint32_t count, float *logprob, int32_t *top_ids,
                           float *top_values);
/* A token mask from the host (a grammar's allowed ids). arc_loop_mask_block gives the host pointers of the loop's
 * mapped mask block (allocated by the first call, not while capturing): ready, then words[ceil(vocab / 32)], id i
 * allowed when bit i % 32 of words[i / 32] is set. The host writes the mask of the sequence's token n (n counts the
 * tokens the ring has published since its reset (ARC_SEQ_RESET_RING, which sets ready to 0), then ready = n + 1.
 * Captured between a step's forward and its sampler, arc_loop_enqueue_mask waits on the device until ready > n for the
 * token n the step is to publish (not at all where its commit will publish nothing: a fault, a stop id, the burst's
 * limit), then sets logits[i] to -inf for every id it forbids and every i in [vocab, width). A wait past
 * ARC_MASK_WAIT_US latches ARC_FAULT_MASK_TIMEOUT. A host that abandons a sequence sets ready to 0xFFFFFFFF: no step
 * waits again until the next reset. */
enum { ARC_MASK_WAIT_US = 2000000 };
int arc_loop_mask_block(arc_loop *loop, uint32_t **words, uint32_t **ready);
int arc_loop_enqueue_mask(arc_loop *loop, float *logits, int32_t width);
/* A logit bias: arc_loop_enqueue_logit_bias adds values[k] to logits[ids[k]] (float32) for the n pairs
 * arc_loop_begin_sequence last wrote (ARC_SEQ_LOGIT_BIAS; stream-ordered; n <= ARC_MAX_LOGIT_BIAS, ids distinct in [0,
 * vocab), values finite; n 0 adds nothing). Captured between a step's forward and its sampler, or enqueued on the host
 * path before the argmax or the copy of the logits. */
enum { ARC_MAX_LOGIT_BIAS = 256 };
int arc_loop_enqueue_logit_bias(arc_loop *loop, float *logits, int32_t width);

/* A sequence's state in the loop, written by one call: arc_loop_begin_sequence writes the parts `parts` names (an OR
 * of ARC_SEQ_*), in the order of the flags' values, each a stream-ordered write that takes effect for the work
 * enqueued after it; no host wait. RESET_RING starts the ring (count, fault word, stop mark, speculative steps,
 * log-probability count, the mask block's ready word back to 0); the host writes the header directly, so it is
 * refused with ARC_BUSY, before anything is written, while work is in flight. STOP_IDS: n_stop_ids (0..
 * ARC_MAX_STOP_IDS) ids in [0, vocab) that end a burst. SAMPLING: the draw's parameters for the sampled steps.
 * LOGPROBS: top_logprobs alternatives each log-probability entry lists (not while capturing: the first allocates the
 * ring). LOGIT_BIAS: n_bias pairs (bias_ids, bias_values). DRAFT_MEMORY: memory[0..n_memory) (device or mapped
 * memory; below). HISTORY: history[0..n_history) (device or mapped memory) at positions history_start.. of the drafts'
 * history (below). INPUT: the token and position the next forward reads (a prompt's last, after its prefill; each
 * step of the host path writes it alone). A failing part returns its status at once: the parts before it are
 * enqueued. */
enum { ARC_SEQ_RESET_RING = 1, ARC_SEQ_STOP_IDS = 2, ARC_SEQ_SAMPLING = 4, ARC_SEQ_LOGPROBS = 8,
       ARC_SEQ_LOGIT_BIAS = 16, ARC_SEQ_DRAFT_MEMORY = 32, ARC_SEQ_HISTORY = 64, ARC_SEQ_INPUT = 128 };
typedef struct arc_sequence {
    uint32_t parts;  /* an OR of ARC_SEQ_*: the parts written */
    const int32_t *stop_ids; int32_t n_stop_ids;
    arc_sampling sampling;
    int32_t top_logprobs;
    const int32_t *bias_ids; const float *bias_values; int32_t n_bias;
    const int32_t *memory; int32_t n_memory;
    const int32_t *history; int32_t n_history; int32_t history_start;
    int32_t token, position;
} arc_sequence;
int arc_loop_begin_sequence(arc_loop *loop, const arc_sequence *seq);

/* The CudaSampler: argmax of logits[n] into *out, ties to the lowest index and NaN above everything, as NumPy's
 * argmax; the winning value into *value_out and the smallest logit (NaN where all are NaN) into *low_out, each
 * unless NULL: the two are equal where the logits are flat. out, value_out and low_out may be device memory or
 * mapped host pointers. */
int arc_argmax(arc_context *ctx, const float *logits, int32_t n, int32_t *out, float *value_out, float *low_out);

/* The draw: one token from logits[n] at sequence position `position`, written to *out (device memory or a mapped
 * host pointer), or -1 when the largest logit is not finite. In order: l = logits + 0 (no negative zero);
 * candidates ordered by larger logit, then lower id; m = max l; w = exp32((l - m) * float(1 / temperature)) in
 * float32, exp32 being e^x from float32 multiplies and adds alone (arcpy/sampling.py defines it), and integer
 * weights q = rint(w * 2^40); top-k keeps the first top_k candidates; top-p keeps the shortest prefix of those
 * whose q-sum is at least ceil(S * p32 / 2^32), S their q-sum and p32 = rint(top_p * 2^32) clamped to [1, 2^32];
 * then x = word 0 of Philox4x32-10 with counter (position, 0, 0, 0) (64-bit position in words 0-1) and key (seed),
 * target = floor(S' * x / 2^32) with S' the kept q-sum, and the token is the first kept id, in ascending id order,
 * whose running q-sum exceeds target. Every step after the weights is integer arithmetic, so a host that computes
 * the same weights draws the same token. n <= arc_sample_max_vocab(). */
int arc_sample(arc_context *ctx, const float *logits, int32_t n, const arc_sampling *sampling,
               int64_t position, int32_t *out);
/* The largest vocabulary the draw handles on this context's device. */
int arc_sample_max_vocab(arc_context *ctx, int32_t *out);

/* The model: a decoder of the Llama family and its kin (below: what a family changes) at batch 1. Weights are bf16
 * (raw 16-bit words) or quantized (arc_format, below), the RoPE inverse frequencies float32; the KV cache is bf16,
 * activations float32. The forward reads the token and the position from an arc_loop, so a graph captured once
 * replays unchanged at every position. */
typedef enum arc_tensor {
    ARC_TENSOR_EMBED = 0,           /* (vocab, dim) */
    ARC_TENSOR_ATTN_NORM = 1,       /* per layer (dim) */
    ARC_TENSOR_WQ = 2,              /* per layer (n_heads * head_dim, dim) */
    ARC_TENSOR_WK = 3,              /* per layer (n_kv_heads * head_dim, dim) */
    ARC_TENSOR_WV = 4,              /* per layer (n_kv_heads * head_dim, dim) */
    ARC_TENSOR_BQ = 5,              /* per layer (n_heads * head_dim), only with qkv_bias */
    ARC_TENSOR_BK = 6,              /* per layer (n_kv_heads * head_dim), only with qkv_bias */
    ARC_TENSOR_BV = 7,              /* per layer (n_kv_heads * head_dim), only with qkv_bias */
    ARC_TENSOR_WO = 8,              /* per layer (dim, n_heads * head_dim) */
    ARC_TENSOR_MLP_NORM = 9,        /* per layer (dim) */
    ARC_TENSOR_W_GATE = 10,         /* per layer (ffn_dim, dim), absent on MoE layers */
    ARC_TENSOR_W_UP = 11,           /* per layer (ffn_dim, dim), absent on MoE layers */
    ARC_TENSOR_W_DOWN = 12,         /* per layer (dim, ffn_dim), absent on MoE layers */
    ARC_TENSOR_FINAL_NORM = 13,     /* (dim) */
    ARC_TENSOR_LM_HEAD = 14,        /* (vocab, dim), absent when tied to the embedding */
    ARC_TENSOR_ROPE_INV_FREQ = 15,  /* per layer (rope_dim / 2) float32: the layer's RoPE frequencies */
    ARC_TENSOR_Q_NORM = 16,         /* per layer (head_dim), only with qk_norm */
    ARC_TENSOR_K_NORM = 17,         /* per layer (head_dim), only with qk_norm */
    ARC_TENSOR_POST_ATTN_NORM = 18, /* per layer (dim), only with post_norms */
    ARC_TENSOR_POST_FFN_NORM = 19,  /* per layer (dim), only with post_norms */
    ARC_TENSOR_MOE_ROUTER = 20,     /* per layer (n_experts, dim), only on MoE layers */
    ARC_TENSOR_MOE_GATE = 21,       /* per layer (n_experts * expert_ffn_dim, dim), only on MoE layers */
    ARC_TENSOR_MOE_UP = 22,         /* per layer (n_experts * expert_ffn_dim, dim), only on MoE layers */
    ARC_TENSOR_MOE_DOWN = 23,       /* per layer (n_experts * dim, expert_ffn_dim), only on MoE layers */
    ARC_TENSOR_SHARED_GATE = 24,    /* per layer (shared_ffn_dim, dim), only on MoE layers with a shared expert */
    ARC_TENSOR_SHARED_UP = 25,      /* per layer (shared_ffn_dim, dim), only on MoE layers with a shared expert */
    ARC_TENSOR_SHARED_DOWN = 26,    /* per layer (dim, shared_ffn_dim), only on MoE layers with a shared expert */
    ARC_TENSOR_SHARED_ROUTER = 27,  /* per layer (1, dim), only on MoE layers with a shared expert */
    ARC_TENSOR_COUNT = 28
} arc_tensor;
typedef enum arc_activation { ARC_ACT_SILU = 0, ARC_ACT_GELU_TANH = 1 } arc_activation;
typedef enum arc_routing { ARC_ROUTE_SOFTMAX_TOPK = 0, ARC_ROUTE_TOPK_SOFTMAX = 1 } arc_routing;

/* What a family changes in the layer is data (below; 0 keeps Llama's behaviour). RoPE: element i
 * of a head pairs with i + rope_dim / 2 at angle float(pos) * inv_freq[i] of the layer's own table
 * (zeros: a layer without RoPE). Layer l is windowed when sliding_window > 0, unless window_pattern
 * n > 0 and l % n == n - 1: its query at p then attends p - sliding_window + 1..p only. */
typedef struct arc_model_config {
    int32_t dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, max_seq;
    float rms_eps;
    int32_t tied_embeddings, qkv_bias;  /* 0 or 1 each: the lm_head is the embedding; q/k/v biases */
    int32_t qk_norm;         /* q, k heads RMS-normed by Q_NORM / K_NORM before RoPE (Qwen3, Gemma 3) */
    int32_t rope_dim;        /* RoPE rotates a head's first rope_dim elements (even; 0: head_dim) */
    float rope_factor;       /* cos and sin times it (YaRN's, LongRoPE's attention factor; 0: 1) */
    int32_t post_norms;      /* attention and FFN outputs RMS-normed before the residual add (Gemma 3) */
    int32_t activation;      /* the GLU's, an arc_activation */
    float embed_scale, attn_scale;  /* the embedding row's factor (0: 1), the scores' (0: 1 / sqrt(head_dim)) */
    int32_t sliding_window, window_pattern;  /* a windowed layer's positions (0: none); every n-th layer global */
    int32_t norm_plus_one;   /* 0 or 1: every norm's factor is 1 + w, its weights stored less one (Gemma) */
    /* Mixture of experts (n_experts 0: none): layer l is one unless (l + 1) % moe_every != 0 (0: 1) or bit l % 32 of
     * dense_layers[l / 32] is set. Routing of p = ROUTER @ n, top k = n_experts_used ties to the lower expert:
     * SOFTMAX_TOPK the top k of softmax(p), divided by their sum if norm_topk; TOPK_SOFTMAX the top k of p, weights
     * their softmax. Expert e (rows e * expert_ffn_dim.. of MOE_GATE, MOE_UP, e * dim.. of MOE_DOWN) adds weight times
     * Wdown_e @ act(Wgate_e @ n) * (Wup_e @ n); shared_ffn_dim > 0: + sigmoid(SHARED_ROUTER @ n) * shared expert.
     * arc_model_create takes n_experts <= 1024, n_experts_used <= 16, expert_ffn_dim % 8 == 0 and n_experts_used *
     * expert_ffn_dim <= 49152; the routing stays on the device, so a captured step serves every routing. */
    int32_t n_experts, n_experts_used, expert_ffn_dim, routing, norm_topk, shared_ffn_dim, moe_every;
    uint32_t dense_layers[4];
} arc_model_config;
int arc_model_create(arc_context *ctx, const arc_model_config *config, arc_model **out);
/* The tensor table, the one libarc lays the weights out by and arcpy names and checks them by: tensor's (rows, cols)
 * in layer (0 for a global tensor) of a model of config, rows 0 where the config has none (a vector: rows 1).
 * Matrices are (out, in); ROPE_INV_FREQ is float32, the rest bf16 or a matrix's format. Host only, no context. */
int arc_tensor_shape(const arc_model_config *config, int32_t tensor, int32_t layer, int64_t *rows, int64_t *cols);

/* The layer program: the sequence of one decoder layer, written once and run by the decode step (GEMVs), the
 * speculative verify (GEMVs over rows), the prefill (tensor-core products) and arcpy's NumPy reference, each op in
 * its own form. arc_layer_program lists a layer's ops in order into ops (ARC_MAX_LAYER_OPS entries); host only, no
 * context. x is the residual stream (float32). */
typedef enum arc_layer_op {
    ARC_OP_ATTN_IN = 0,   /* qkv = [Wq; Wk; Wv] @ rmsnorm(x, ATTN_NORM) (+ [bq; bk; bv]) */
    ARC_OP_QK_NORM = 1,   /* each head of q and k = rmsnorm(head, Q_NORM / K_NORM) */
    ARC_OP_ATTEND = 2,    /* q, k rotated (the layer's table); k, v -> the cache; att = attention */
    ARC_OP_ATTN_OUT = 3,  /* x += Wo @ att */
    ARC_OP_FFN_IN = 4,    /* h = act(Wgate @ n) * (Wup @ n), n = rmsnorm(x, MLP_NORM) */
    ARC_OP_FFN_OUT = 5,   /* x += Wdown @ h */
    ARC_OP_ATTN_OUT_NORM = 6,  /* x += rmsnorm(Wo @ att, POST_ATTN_NORM) */
    ARC_OP_FFN_OUT_NORM = 7,   /* x += rmsnorm(Wdown @ h, POST_FFN_NORM) */
    ARC_OP_MOE_IN = 8, ARC_OP_MOE_OUT = 9  /* FFN_IN, FFN_OUT of a mixture of experts (arc_model_config) */
} arc_layer_op;
int arc_layer_program(const arc_model_config *config, int32_t layer, int32_t *ops, int32_t *count);

/* Weight formats. A matrix tensor (WQ, WK, WV, WO, W_GATE, W_UP, W_DOWN, LM_HEAD; MOE_, SHARED_ GATE, UP, DOWN)
 * may be held in one of the quantized formats below instead of bf16; the embedding, the norms, the biases and
 * the RoPE frequencies are always bf16 (float32 for the frequencies). The quantized formats are
 * llama.cpp's GGUF block types, repacked by row so that every load is 16-byte aligned and
 * coalesced; the values they hold are exactly the GGUF blocks' values.
 *
 * A row of `cols` weights (cols % 32 == 0; % 256 for the _K formats and IQ4_XS) is a sequence of
 * units of 32 consecutive weights (unit u: columns 32u..32u+31); a _K superblock is 8 units. A row is
 * four arrays, A then B then C then D, each padded with zeros to a multiple of 16 bytes; rows
 * follow each other with no gap (arc_format_row_bytes gives a row's size).
 *   A (quants): Q8_0: 32 bytes a unit, int8 weight k at byte k. Q4_0, Q4_1, Q4_K, Q5_K, Q6_K,
 *     Q5_0, Q5_1: 16 bytes a unit, byte k (0..15) holding the low 4 bits of weight k in its low
 *     nibble and those of weight k + 16 in its high nibble. MXFP4, IQ4_NL, IQ4_XS (codebook
 *     formats): 16 bytes a unit of 4-bit codes, its uint32 word i (0..3) holding those of weights
 *     4i..4i+3 in its nibbles 0..3 (from the least significant) and of weights 16+4i..16+4i+3 in
 *     its nibbles 4..7. Q3_K, Q2_K: 8 bytes a unit, two uint32 L0, L1, bits 8b + 2i and 8b + 2i + 1
 *     of L0 = the 2-bit quant of weight 4i + b, of L1 = that of weight 16 + 4i + b.
 *   B (high bits): Q5_K, Q5_0, Q5_1, Q3_K: a uint32 H a unit, bit 8b + i = bit 4 (Q3_K: bit 2)
 *     of weight 4i + b and bit 8b + 4 + i = that bit of weight 16 + 4i + b (b, i in 0..3). Q6_K:
 *     two uint32 H0, H1 a unit, bits 8b + 2i and 8b + 2i + 1 of H0 = bits 4 and 5 of weight
 *     4i + b, of H1 = those of weight 16 + 4i + b. Other formats: empty.
 *   C (scales): Q8_0, Q4_0: a float16 d a unit. Q4_1: float16 d then float16 m, a unit.
 *     Q4_K, Q5_K: 16 bytes a superblock, GGUF's own: float16 d, float16 dmin, 12 bytes of
 *     6-bit scales and mins (unit j of the superblock: GGUF's get_scale_min_k4(j)). Q6_K: 16
 *     int8 scales a superblock, scale j for its weights 16j..16j+15. MXFP4: a uint8 exponent e a
 *     unit. IQ4_NL: a float16 d a unit. IQ4_XS: an int8 scale s a unit (-32..31). Q5_0: a
 *     float16 d a unit. Q5_1: float16 d then float16 m, a unit. Q3_K: 16 int8 scales a superblock
 *     (-32..31), scale j for its weights 16j..16j+15. Q2_K: GGUF's 16 bytes a superblock, byte j
 *     for its weights 16j..16j+15: the scale in its low nibble, the min in its high one.
 *   D: Q6_K, IQ4_XS, Q3_K: a float16 d a superblock. Q2_K: float16 d then float16 dmin, a
 *     superblock. Other formats: empty.
 * The weight, with q the unit's quant (4 bits; 5 with the Q5 formats' high bit; 6 with Q6_K's two;
 * 2 with Q2_K's, 3 with Q3_K's and its high bit):
 *   Q8_0 d * q (q signed)     Q4_0 d * (q - 8)       Q4_1 d * q + m
 *   Q4_K, Q5_K  d * sc * q - dmin * m (sc, m: the unit's 6-bit scale and min)
 *   Q6_K  d * scale * (q - 32)    Q5_0 d * (q - 16)    Q5_1 d * q + m
 *   Q3_K  d * scale * (q - 4)     Q2_K  d * sc * q - dmin * m (sc, m: the nibbles of the weight's byte)
 *   MXFP4  2^(e - 128) * {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}[q] (e2m1, doubled)
 *   IQ4_NL d * V[q], IQ4_XS d * s * V[q]: V = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13,
 *     25, 38, 53, 69, 89, 113}
 * The quantized GEMVs quantize their input too, per unit: amax = max |x| over the unit's 32
 * inputs (after the fused norm), x_q = rint(x * (127 / amax)) clamped to [-127, 127] (0 where
 * amax is 0; +-127 where 127 / amax overflows), dx = amax / 127; the unit's dot is dx times an
 * exact integer sum of q * x_q, scaled as above. */
typedef enum arc_format { ARC_FORMAT_BF16 = 0, ARC_FORMAT_Q8_0 = 1, ARC_FORMAT_Q4_0 = 2, ARC_FORMAT_Q4_1 = 3,
                          ARC_FORMAT_Q4_K = 4, ARC_FORMAT_Q5_K = 5, ARC_FORMAT_Q6_K = 6, ARC_FORMAT_MXFP4 = 7,
                          ARC_FORMAT_IQ4_NL = 8, ARC_FORMAT_IQ4_XS = 9, ARC_FORMAT_Q5_0 = 10,
                          ARC_FORMAT_Q5_1 = 11, ARC_FORMAT_Q3_K = 12, ARC_FORMAT_Q2_K = 13 } arc_format;

/* Bytes of one row of `cols` weights in `format` (bf16: 2 * cols). Host only; no context. */
int arc_format_row_bytes(int32_t format, int32_t cols, uint64_t *out);

/* arc_model_create with a format for each tensor: formats[tensor * n_layers + layer] (global tensors at layer 0),
 * ARC_TENSOR_COUNT entries per layer; NULL means bf16 throughout. A tensor's upload then takes rows *
 * arc_format_row_bytes(format, cols) bytes. */
int arc_model_create_formats(arc_context *ctx, const arc_model_config *config, const int32_t *formats,
                             arc_model **out);
int arc_model_destroy(arc_model *model);
int arc_model_upload(arc_model *model, int32_t tensor, int32_t layer, const void *host, uint64_t bytes);
int arc_model_forward(arc_model *model, arc_loop *loop);
/* The greedy step in one kernel less: the forward, with its lm_head also taking the argmax of the logits and
 * committing it to loop as arc_loop_enqueue_sample_commit does (the same token, the same faults; the logits are
 * written as well). Captured, it is the greedy step graph. */
int arc_model_forward_commit(arc_model *model, arc_loop *loop);
int arc_model_logits(arc_model *model, const float **logits, int32_t *vocab);
/* Device bytes the model holds: its weights, its KV cache, and its activations (the decode's and, once reserved,
 * the prefill's, with its scratch for dequantized matrices and a mixture of experts' routed rows). */
int arc_model_memory(arc_model *model, uint64_t *weights, uint64_t *kv_cache, uint64_t *activations);

/* The prefill: a chunk of prompt tokens through the whole model in one forward. The matrix products run on tensor
 * cores with bf16 inputs and float32 sums: a product's input (the normed activations, the attention output, the
 * SwiGLU output) is rounded to bf16, the residual stream stays float32, and the KV cache is written exactly as the
 * decode writes it for each position (up to those roundings upstream). */

/* Reserves the prefill's activations for chunks of up to max_chunk tokens (allocates; call at load time, not per
 * request; a chunk is never longer than the model's max_seq, so at most that many are reserved). A later call with
 * a larger max_chunk reallocates; a smaller one keeps the reservation. Not while a graph is being captured. */
int arc_model_prefill_reserve(arc_model *model, int32_t max_chunk);
/* The forward over tokens[0..n) at positions start..start+n-1: the KV cache written for every one of them, and the
 * logits of the last (position start+n-1) written where arc_model_logits points, what arc_model_forward would leave
 * there for that token. In chunks of at most the reserved size, enqueued on the context's stream; no host wait, no
 * synchronize. `tokens` is device memory or a mapped host pointer (read on the device). Requires n >= 1, start >=
 * 0, start + n <= max_seq, a reservation, every tensor uploaded. Token ids are not checked on the device (an id
 * outside the vocabulary writes NaN, as the decode embedding does); the caller validates them. */
int arc_model_prefill(arc_model *model, const int32_t *tokens, int32_t n, int32_t start);
/* The prompt's own log-probabilities: arc_model_prefill(model, tokens, n, start) (the same KV rows, the same last
 * logits), and for each row r in [0, n - 1) the log-probability of tokens[r + 1] under log_softmax of that row's
 * logits[0..vocab), with the top_n most likely ids and theirs, as arc_loop_enqueue_logprobs computes and ranks them:
 * logprob[n - 1], top_ids and top_values [n - 1][ARC_MAX_TOP_LOGPROBS] (entries past top_n not written), device or
 * mapped memory, stream-ordered. A row's logits are those arc_model_prefill leaves for its last position (the
 * decode's lm_head GEMV): bit for bit what a prefill of tokens[0..r] leaves, whatever chunk the row is in. Requires
 * what arc_model_prefill requires, n >= 2, 1 <= vocab <= the lm_head's rows, 0 <= top_n <= ARC_MAX_TOP_LOGPROBS; a
 * target outside [0, vocab) scores NaN. */
int arc_model_prompt_logprobs(arc_model *model, const int32_t *tokens, int32_t n, int32_t start, int32_t vocab,
                              int32_t top_n, float *logprob, int32_t *top_ids, float *top_values);
/* The model's KV cache (device memory): k and v, each (n_layers, n_kv_heads, max_seq, head_dim) bf16; rows the
 * forward or the prefill have not written hold zeros. */
int arc_model_kv_cache(arc_model *model, uint16_t **k_cache, uint16_t **v_cache);

/* ---- Speculative steps: up to k + 1 tokens a read of the weights (greedy or sampled; bf16 or quantized weights, no
 * mixture of experts). The draft: the latest earlier occurrence of the last n tokens (n = ngram down to 1, longest
 * first) in the loop's history (then in its memory of earlier sequences, ARC_SEQ_DRAFT_MEMORY), and the k
 * tokens that followed it (periodic past p). The verify forward: the token
 * and the drafts at positions p..p+k in one pass, each row through the decode's own kernels or their form over
 * rows, which keep each row's sums in the decode's order: every row's logits are the decode step's at that
 * position, bit for bit, so the tokens are the plain loop's, greedy or sampled with the same seed
 * (arc_op_gemv_rows and arc_op_qgemv_rows say how). The accept: the token after row 0 (its argmax, or sampled its
 * draw), then after row i while draft i matched the token after row i - 1, each through the commit's checks (and
 * the burst's limit); then .steps. The history (max_seq ids) gets every commit's token; ARC_SEQ_HISTORY writes
 * history[0..n_history) at history_start.., stream-ordered. ---- */
/* The drafts' memory of earlier sequences (ARC_SEQ_DRAFT_MEMORY): memory[0..n_memory), stream-ordered, kept until the
 * next (n_memory = 0 empties it). A negative id separates two sequences, and one follows the last. The draft looks it
 * up as if it came right before the history's position 0: a match there ranks below an equally long one in the
 * history, and its drafts stop at the next separator. It changes which tokens are drafted, never which are
 * published. */
enum { ARC_DRAFT_MEMORY = 16384 };  /* ARC_SEQ_DRAFT_MEMORY takes n_memory < this */
/* The step's buffers for k drafts (1..7; 0 frees them). At load, not while capturing; a mixture of experts is
 * refused. */
int arc_model_speculate_reserve(arc_model *model, int32_t k);
/* One speculative step on the loop, drafts by n-grams of up to ngram (1..8) tokens; capturable. */
int arc_model_forward_speculate(arc_model *model, arc_loop *loop, int32_t ngram);
/* The same step sampled: the token after each row is drawn from that row's logits with the loop's sampling
 * parameters at that row's position (ARC_SEQ_SAMPLING; the draw of arc_loop_enqueue_draw_commit, with the
 * same Philox counter: the position of the token drawn), and a draft is accepted where it equals the drawn token.
 * So every published token is a draw from the model's distribution after the tokens before it, and with the plain
 * step's logits it would be the plain sampled step's token. The loop's vocabulary must fit the draw
 * (arc_sample_max_vocab); capturable. */
int arc_model_forward_speculate_draw(arc_model *model, arc_loop *loop, int32_t ngram);
/* The last step's rows: logits (k + 1, vocab) float32, inputs tokens[0..k], tokens[k + 1] drafts. */
int arc_model_speculation(arc_model *model, const float **logits, const int32_t **tokens, int32_t *rows);

/* ---- The all-reduce of tensor parallelism (NCCL, loaded at run time from `library`, a path; null: libnccl.so.2
 * where the dynamic loader finds it; no NCCL is ARC_NO_DEVICE). A communicator is one rank's, on one context. ---- */
typedef struct arc_comm arc_comm;
enum { ARC_COMM_ID_BYTES = 128, ARC_MAX_WORLD = 8 };
/* A new unique id for a world's ranks to join with (id: ARC_COMM_ID_BYTES bytes). */
int arc_comm_unique_id(const char *library, uint8_t *id);
/* Rank `rank` of `world` (1..ARC_MAX_WORLD) joins the world of `id`, on ctx's device; blocks until every rank has
 * joined (each from its own thread or process), so at load, not while capturing. The context holds it (one at a
 * time) until arc_comm_destroy, which comes before the context's: a model's forward on that context is then the
 * rank's share of a split model (its heads, FFN rows; the lm_head whole), its o and down products summed over the
 * ranks (the residual added by rank 0's); its prefill and speculative steps are refused. */
int arc_comm_create(arc_context *ctx, const char *library, const uint8_t *id, int32_t world, int32_t rank,
                    arc_comm **out);
/* Every rank of a world of `world` contexts (each its own GPU) at once, from this process (ncclCommInitAll), their
 * first all-reduce run together so that none waits for its peers later; out[r] is rank r's, held by ctxs[r]. */
int arc_comm_create_all(arc_context *const *ctxs, int32_t world, const char *library, arc_comm **out);
/* recv[0..count) = the sum over the world's ranks of their send[0..count) (device memory, float32; send == recv: in
 * place), enqueued on the context's stream; every rank enqueues its own, in the same order. Capturable: a graph
 * replays it with no host in between. (A world of one copies send to recv, and in place does nothing at all.) */
int arc_comm_all_reduce(arc_comm *comm, const float *send, float *recv, int64_t count);
/* The world's size, this rank, and the NCCL version (as ncclGetVersion: 22703 for 2.27.3). */
int arc_comm_info(arc_comm *comm, int32_t *world, int32_t *rank, int32_t *nccl_version);
int arc_comm_destroy(arc_comm *comm);

/* arc-cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* ARC_H */
