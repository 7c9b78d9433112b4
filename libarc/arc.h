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
 * The model (its config, tensor table, layer program, weight formats, forwards and speculative
 * steps) is declared in arc_model.h, which this header includes.
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

#include "arc_model.h" /* the model: its config, tensors, layer program, weight formats and forwards */

#endif /* ARC_H */
