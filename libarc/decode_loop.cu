// decode_loop.cu -- the device loop's state and ring: the pinned host-mapped ring the commit
// (commit.cuh) publishes into, the fault word, and the small kernels that write the loop's state.
//
// One step is one launch of a step graph: the forward (reading DeviceState::token and
// ::position), then a sampler (sampler.cu), whose deciding thread commits. The commit's
// per-sequence and per-burst inputs (stop ids, sampling parameters, burst id) live in
// DeviceState, written by small stream-ordered kernels, so the graphs are captured once and
// replayed unchanged. The host enqueues a burst of steps and watches the ring with plain loads;
// it never waits on the stream to learn a token.
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "internal.cuh"

// Small stream-ordered writes of DeviceState: they take effect for the work enqueued after them.
struct StopIds {
    int32_t n;
    int32_t ids[ARC_MAX_STOP_IDS];
};

__global__ void set_input_kernel(DeviceState *st, uint32_t token, int pos) {
    st->token = token;
    st->position = pos;
}

__global__ void set_stop_ids_kernel(DeviceState *st, StopIds stops) {
    st->n_stop_ids = stops.n;
    for (int k = 0; k < ARC_MAX_STOP_IDS; ++k) st->stop_ids[k] = stops.ids[k];
}

// The burst's limit counts from what is published when it begins: max_tokens 0 means none
// (the count would take 2^32 - 1 more tokens to reach it).
__global__ void begin_burst_kernel(DeviceState *st, uint32_t burst, uint32_t max_tokens) {
    st->burst = burst;
    st->limit = st->published + (max_tokens ? max_tokens : 0xFFFFFFFFu);
}

__global__ void reset_ring_kernel(DeviceState *st) {
    st->published = 0;
    st->fault = 0;
    st->stopped = 0;
    st->steps = 0;
    st->limit = 0xFFFFFFFFu;
    st->logprobs = 0;
}

// history[start + i] = tokens[i] for i < n.
__global__ void set_history_kernel(int32_t *history, const int32_t *tokens, int n, int start) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        history[start + i] = tokens[i];
}

// The drafts' memory: tokens[0..n) then a separator, ending right before history[0]; n = 0 empties it.
__global__ void set_memory_kernel(DeviceState *st, int32_t *history, const int32_t *tokens, int n) {
    const int used = n > 0 ? n + 1 : 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        history[i - used] = tokens[i];
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        if (n > 0) history[-1] = -1;
        st->memory = used;
    }
}

__global__ void inject_kernel(DeviceState *st, int32_t n) { st->lose_in = n; }

// --- The loop handle ---------------------------------------------------------------------

// Pinned layout: the ring header on its own cache line, then the slots.
enum { PINNED_HEADER = 64 };

static void loop_release(arc_loop *loop) {
    if (loop->ring_host) cudaFreeHost(loop->ring_host);
    if (loop->lp_host) cudaFreeHost(loop->lp_host);
    if (loop->mask_host) cudaFreeHost(loop->mask_host);
    if (loop->lp_part) cudaFree(loop->lp_part);
    if (loop->lp_done) cudaFree(loop->lp_done);
    if (loop->state) cudaFree(loop->state);
    if (loop->history) cudaFree(loop->history - ARC_DRAFT_MEMORY);
    free(loop);
}

static int loop_init(arc_loop *loop) {
    arc_context *ctx = loop->ctx;
    size_t bytes = PINNED_HEADER + (size_t)loop->capacity * sizeof(int32_t);
    void *h = nullptr;
    ARC_CUDA(ctx, cudaHostAlloc(&h, bytes, cudaHostAllocMapped));
    memset(h, 0, bytes);
    loop->ring_host = (RingHeader *)h;
    void *d = nullptr;
    ARC_CUDA(ctx, cudaHostGetDevicePointer(&d, h, 0));
    loop->ring_dev = (RingHeader *)d;
    loop->slots_host = (int32_t *)((char *)h + PINNED_HEADER);
    loop->slots_dev = (int32_t *)((char *)d + PINNED_HEADER);
    ARC_CUDA(ctx, cudaMalloc(&loop->state, sizeof(DeviceState)));
    ARC_CUDA(ctx, cudaMemsetAsync(loop->state, 0, sizeof(DeviceState), ctx->stream));
    int32_t *history = nullptr;
    const size_t history_ids = (size_t)ARC_DRAFT_MEMORY + loop->max_seq;
    ARC_CUDA(ctx, cudaMalloc(&history, history_ids * sizeof(int32_t)));
    loop->history = history + ARC_DRAFT_MEMORY;
    ARC_CUDA(ctx, cudaMemsetAsync(history, 0, history_ids * sizeof(int32_t), ctx->stream));
    inject_kernel<<<1, 1, 0, ctx->stream>>>(loop->state, -1);
    ARC_LAUNCHED(ctx, "inject_kernel");
    reset_ring_kernel<<<1, 1, 0, ctx->stream>>>(loop->state);
    ARC_LAUNCHED(ctx, "reset_ring_kernel");
    return ARC_OK;
}

extern "C" int arc_loop_create(arc_context *ctx, int32_t vocab, int32_t max_seq,
                               int32_t ring_capacity, arc_loop **out) {
    ARC_REQUIRE(ctx && out, "null argument");
    *out = nullptr;
    ARC_REQUIRE(vocab > 0, "vocab must be positive, got %d", vocab);
    ARC_REQUIRE(max_seq > 0, "max_seq must be positive, got %d", max_seq);
    ARC_REQUIRE(ring_capacity > 0 && ring_capacity <= (1 << 20),
                "ring_capacity must be in [1, 1048576], got %d", ring_capacity);
    arc_loop *loop = (arc_loop *)calloc(1, sizeof *loop);
    if (!loop) return arc_fail(ARC_OUT_OF_MEMORY, __func__, "host allocation failed");
    loop->ctx = ctx;
    loop->vocab = vocab;
    loop->max_seq = max_seq;
    loop->capacity = ring_capacity;
    int st = loop_init(loop);
    if (st != ARC_OK) {
        loop_release(loop);
        return st;
    }
    *out = loop;
    return ARC_OK;
}

extern "C" int arc_loop_destroy(arc_loop *loop) {
    ARC_REQUIRE(loop, "loop is null");
    loop_release(loop);
    return ARC_OK;
}

// Where the forward reads its input: both in device memory, written only by stream-ordered
// kernels (ARC_SEQ_INPUT, the commit), so a forward never reads across the bus.
extern "C" int arc_loop_token_input(arc_loop *loop, const uint32_t **token,
                                    const int32_t **position) {
    ARC_REQUIRE(loop && token && position, "null argument");
    *token = &loop->state->token;
    *position = &loop->state->position;
    return ARC_OK;
}

static int set_stop_ids(arc_loop *loop, const int32_t *ids, int32_t count) {
    ARC_REQUIRE(count >= 0 && count <= ARC_MAX_STOP_IDS, "at most %d stop ids, got %d",
                ARC_MAX_STOP_IDS, count);
    ARC_REQUIRE(count == 0 || ids, "ids is null");
    StopIds stops = {};
    stops.n = count;
    for (int k = 0; k < count; ++k) {
        ARC_REQUIRE(ids[k] >= 0 && ids[k] < loop->vocab, "stop id %d is outside [0, %d)", ids[k],
                    loop->vocab);
        stops.ids[k] = ids[k];
    }
    arc_context *ctx = loop->ctx;
    set_stop_ids_kernel<<<1, 1, 0, ctx->stream>>>(loop->state, stops);
    ARC_LAUNCHED(ctx, "set_stop_ids_kernel");
    return ARC_OK;
}

static int set_input(arc_loop *loop, int32_t token, int32_t position) {
    ARC_REQUIRE(token >= 0 && token < loop->vocab, "token %d is outside [0, %d)", token, loop->vocab);
    ARC_REQUIRE(position >= 0 && position < loop->max_seq, "position %d is outside [0, %d)",
                position, loop->max_seq);
    arc_context *ctx = loop->ctx;
    set_input_kernel<<<1, 1, 0, ctx->stream>>>(loop->state, (uint32_t)token, position);
    ARC_LAUNCHED(ctx, "set_input_kernel");
    return ARC_OK;
}

// Starts a new sequence's ring: count, fault word and stop mark back to zero. The host writes
// the header directly, so no commit may be in flight: refused with ARC_BUSY unless idle.
static int reset_ring(arc_loop *loop) {
    int st = arc_stream_query(loop->ctx);
    if (st == ARC_NOT_READY)
        return arc_fail(ARC_BUSY, "arc_loop_begin_sequence",
                        "steps are still in flight; reset once the stream is idle");
    if (st != ARC_OK) return st;
    arc_context *ctx = loop->ctx;
    reset_ring_kernel<<<1, 1, 0, ctx->stream>>>(loop->state);
    ARC_LAUNCHED(ctx, "reset_ring_kernel");
    RingHeader *r = loop->ring_host;
    r->published = 0;
    r->fault = 0;
    r->fault_token = 0;
    r->fault_pos = 0;
    r->stopped = 0;
    r->steps = 0;
    r->logprobs = 0;
    if (loop->mask_host) *(volatile uint32_t *)loop->mask_host = 0;  // no mask of the new sequence yet
    return ARC_OK;
}

static int set_history(arc_loop *loop, const int32_t *tokens, int32_t n, int32_t start) {
    ARC_REQUIRE(tokens, "null argument");
    ARC_REQUIRE(n >= 1 && start >= 0 && (int64_t)start + n <= loop->max_seq,
                "%d tokens at position %d do not fit max_seq %d", n, start, loop->max_seq);
    arc_context *ctx = loop->ctx;
    const int blocks = (n + 255) / 256 < 64 ? (n + 255) / 256 : 64;
    set_history_kernel<<<blocks, 256, 0, ctx->stream>>>(loop->history, tokens, n, start);
    ARC_LAUNCHED(ctx, "set_history_kernel");
    return ARC_OK;
}

static int set_draft_memory(arc_loop *loop, const int32_t *tokens, int32_t n) {
    ARC_REQUIRE(tokens || n == 0, "null argument");
    ARC_REQUIRE(n >= 0 && n < ARC_DRAFT_MEMORY, "a draft memory of %d tokens: it holds 0..%d", n, ARC_DRAFT_MEMORY - 1);
    arc_context *ctx = loop->ctx;
    const int blocks = n < 256 ? 1 : ((n + 255) / 256 < 64 ? (n + 255) / 256 : 64);
    set_memory_kernel<<<blocks, 256, 0, ctx->stream>>>(loop->state, loop->history, tokens, n);
    ARC_LAUNCHED(ctx, "set_memory_kernel");
    return ARC_OK;
}

// The parts `seq->parts` names, in this order, each a stream-ordered write (the ring's reset
// first, refused with ARC_BUSY before anything is written). A failing part returns at once:
// the parts before it are enqueued, those after it are not.
extern "C" int arc_loop_begin_sequence(arc_loop *loop, const arc_sequence *seq) {
    ARC_REQUIRE(loop && seq, "null argument");
    const uint32_t parts = seq->parts;
    const uint32_t known = ARC_SEQ_RESET_RING | ARC_SEQ_STOP_IDS | ARC_SEQ_SAMPLING | ARC_SEQ_LOGPROBS |
                           ARC_SEQ_LOGIT_BIAS | ARC_SEQ_DRAFT_MEMORY | ARC_SEQ_HISTORY | ARC_SEQ_INPUT;
    ARC_REQUIRE((parts & ~known) == 0, "unknown parts 0x%x", parts & ~known);
    int st = ARC_OK;
    if ((parts & ARC_SEQ_RESET_RING) && (st = reset_ring(loop)) != ARC_OK) return st;
    if ((parts & ARC_SEQ_STOP_IDS) && (st = set_stop_ids(loop, seq->stop_ids, seq->n_stop_ids)) != ARC_OK)
        return st;
    if ((parts & ARC_SEQ_SAMPLING) && (st = loop_set_sampling(loop, &seq->sampling)) != ARC_OK) return st;
    if ((parts & ARC_SEQ_LOGPROBS) && (st = loop_set_logprobs(loop, seq->top_logprobs)) != ARC_OK) return st;
    if ((parts & ARC_SEQ_LOGIT_BIAS) &&
        (st = loop_set_logit_bias(loop, seq->bias_ids, seq->bias_values, seq->n_bias)) != ARC_OK)
        return st;
    if ((parts & ARC_SEQ_DRAFT_MEMORY) && (st = set_draft_memory(loop, seq->memory, seq->n_memory)) != ARC_OK)
        return st;
    if ((parts & ARC_SEQ_HISTORY) &&
        (st = set_history(loop, seq->history, seq->n_history, seq->history_start)) != ARC_OK)
        return st;
    if ((parts & ARC_SEQ_INPUT) && (st = set_input(loop, seq->token, seq->position)) != ARC_OK) return st;
    return ARC_OK;
}

// The commits enqueued after this belong to burst `burst_id` (a stop id ends that burst). Written
// to the device only when the id changes: once per burst.
static int begin_burst(arc_loop *loop, uint32_t burst_id, uint32_t max_tokens, const char *who) {
    ARC_REQUIRE_AS(who, loop, "loop is null");
    ARC_REQUIRE_AS(who, burst_id != 0, "burst id 0 is reserved");
    if (burst_id == loop->burst) return ARC_OK;
    arc_context *ctx = loop->ctx;
    begin_burst_kernel<<<1, 1, 0, ctx->stream>>>(loop->state, burst_id, max_tokens);
    ARC_LAUNCHED(ctx, "begin_burst_kernel");
    loop->burst = burst_id;
    return ARC_OK;
}

extern "C" int arc_loop_begin_burst(arc_loop *loop, uint32_t burst_id) {
    return begin_burst(loop, burst_id, 0, __func__);
}

extern "C" int arc_loop_begin_burst_limit(arc_loop *loop, uint32_t burst_id, uint32_t max_tokens) {
    ARC_REQUIRE(max_tokens >= 1, "a burst publishes at least one token (max_tokens %u)", max_tokens);
    return begin_burst(loop, burst_id, max_tokens, __func__);
}

// One step of burst `burst_id`: a launch of the step graph.
extern "C" int arc_loop_enqueue_step(arc_loop *loop, arc_graph *step_graph, uint32_t burst_id) {
    ARC_REQUIRE(loop && step_graph, "null argument");
    ARC_REQUIRE(step_graph->commits == loop,
                "the graph was not captured with this loop's sample-and-commit");
    int st = arc_loop_begin_burst(loop, burst_id);
    if (st != ARC_OK) return st;
    return arc_graph_launch(step_graph);
}

// Plain loads, no CUDA call. Read in the reverse of the order the device writes them, with an
// acquire fence between: the stop mark and the fault code first, then the count, then what the
// count and the code cover (the slots, the fault detail).
extern "C" int arc_ring_poll(arc_loop *loop, arc_ring_state *state) {
    ARC_REQUIRE(loop && state, "null argument");
    const RingHeader *r = loop->ring_host;
    state->steps = r->steps;
    state->stopped = r->stopped;
    state->fault = r->fault;
    std::atomic_thread_fence(std::memory_order_acquire);
    state->published = r->published;
    std::atomic_thread_fence(std::memory_order_acquire);
    state->fault_token = r->fault_token;
    state->fault_pos = r->fault_pos;
    // Last: a fault or an idle stream seen above means every published token's entry is written.
    std::atomic_thread_fence(std::memory_order_acquire);
    state->logprobs = r->logprobs;
    return ARC_OK;
}

extern "C" int arc_ring_read(arc_loop *loop, uint32_t first, uint32_t count, int32_t *tokens) {
    ARC_REQUIRE(loop && (tokens || count == 0), "null argument");
    uint32_t published = loop->ring_host->published;
    std::atomic_thread_fence(std::memory_order_acquire);
    ARC_REQUIRE((uint64_t)first + count <= published, "tokens [%u, %u) are not published yet (%u)",
                first, first + count, published);
    ARC_REQUIRE(published - first <= (uint32_t)loop->capacity,
                "token %u was overwritten (ring capacity %d)", first, loop->capacity);
    const volatile int32_t *slots = loop->slots_host;
    for (uint32_t k = 0; k < count; ++k) tokens[k] = slots[(first + k) % (uint32_t)loop->capacity];
    return ARC_OK;
}

// Fault injection for tests: the n-th commit from now (0: the next) does nothing.
extern "C" int arc_loop_inject_lost_step(arc_loop *loop, int32_t n) {
    ARC_REQUIRE(loop, "loop is null");
    arc_context *ctx = loop->ctx;
    inject_kernel<<<1, 1, 0, ctx->stream>>>(loop->state, n < 0 ? -1 : n);
    ARC_LAUNCHED(ctx, "inject_kernel");
    return ARC_OK;
}
