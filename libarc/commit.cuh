// commit.cuh -- the commit: what the device loop's samplers (argmax and draw, sampler.cu) do with
// the token they chose. One thread of the sampler's grid calls commit_token once per step.
#pragma once

#include <stddef.h>

#include "internal.cuh"
#include "model/kernels.cuh"

// Where a step's commit writes: the loop's device state and its pinned, mapped ring.
struct CommitArgs {
    DeviceState *st;
    RingHeader *ring;
    int32_t *slots;
    int vocab, max_seq, capacity;
};

// The commit arguments of a loop's step graphs.
inline CommitArgs commit_args(arc_loop *loop) {
    return CommitArgs{loop->state, loop->ring_dev, loop->slots_dev, loop->vocab, loop->max_seq, loop->capacity};
}

// What the commit reads of the loop's state: the leading 64 bytes of DeviceState. Only commits
// (and the stream-ordered kernels between steps) write them, so a step's sampler may read them at
// its start; fetched then, they cost the commit no memory round trip at its end, where its loads
// would otherwise follow one another.
struct __align__(16) CommitView {
    int32_t position;
    uint32_t token, published, fault, stopped, burst;
    int32_t lose_in, n_stop_ids;
    int32_t stop_ids[ARC_MAX_STOP_IDS];
};
static_assert(sizeof(CommitView) == 64 && offsetof(DeviceState, position) == offsetof(CommitView, position) &&
                  offsetof(DeviceState, published) == offsetof(CommitView, published) &&
                  offsetof(DeviceState, fault) == offsetof(CommitView, fault) &&
                  offsetof(DeviceState, stopped) == offsetof(CommitView, stopped) &&
                  offsetof(DeviceState, burst) == offsetof(CommitView, burst) &&
                  offsetof(DeviceState, lose_in) == offsetof(CommitView, lose_in) &&
                  offsetof(DeviceState, n_stop_ids) == offsetof(CommitView, n_stop_ids) &&
                  offsetof(DeviceState, stop_ids) == offsetof(CommitView, stop_ids),
              "CommitView mirrors the head of DeviceState");

// Thread 0 of a block copies the view into shared memory (cp.async: nothing waits for it yet);
// call after pdl_wait. commit_view_ready() (thread 0 again) waits for the copy; a barrier after it
// shows the view to the block.
__device__ __forceinline__ void commit_view_fetch(const CommitArgs &c, CommitView *view) {
    if (threadIdx.x != 0) return;
    const char *src = reinterpret_cast<const char *>(c.st);
#pragma unroll
    for (int i = 0; i < 4; ++i) cp_async16(smem_addr(reinterpret_cast<char *>(view) + 16 * i), src + 16 * i, true);
    cp_async_commit();
}

__device__ __forceinline__ void commit_view_ready() {
    if (threadIdx.x == 0) cp_async_wait<0>();
}

// True for NaN and +-inf: the exponent bits all set. A bit test, so no compiler flag can fold it.
__device__ __forceinline__ bool nonfinite(float v) {
    return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}

// Checks the sampled token, the logit that decided it (the argmax's winner, the draw's maximum),
// and the next position before writing anything, reading the state as `v` (the block's view of
// it); on a violation latches the fault word (sticky: later steps publish nothing). A non-finite
// logit is checked first: NaN wins the argmax wherever it lies, so a broken forward is reported
// as broken, not as a token out of range. Otherwise feeds the token to the next forward, bumps
// the position, and publishes the token: slot first, then a system-wide fence, then the count, so
// a host that sees the count sees the slot. A stop id ends the burst: later steps of the same
// burst publish nothing.
__device__ inline void commit_token(const CommitArgs &c, const CommitView &v, int tok, float value) {
    DeviceState *st = c.st;
    RingHeader *ring = c.ring;
    volatile int32_t *slots = c.slots;
    if (v.lose_in >= 0) {  // injected: as if never launched
        st->lose_in = v.lose_in - 1;
        if (v.lose_in == 0) return;
    }
    if (v.fault != 0 || v.stopped == v.burst) return;
    int next = v.position + 1;
    uint32_t code = ARC_FAULT_NONE;
    if (nonfinite(value)) code = ARC_FAULT_NONFINITE;
    else if (tok < 0 || tok >= c.vocab) code = ARC_FAULT_TOKEN_RANGE;
    else if (next >= c.max_seq) code = ARC_FAULT_POSITION_RANGE;
    if (code != ARC_FAULT_NONE) {
        st->fault = code;
        ring->fault_token = tok;
        ring->fault_pos = next;
        __threadfence_system();
        ring->fault = code;
        return;
    }
    st->token = (uint32_t)tok;
    st->position = next;
    uint32_t n = v.published;
    slots[n % (uint32_t)c.capacity] = tok;
    __threadfence_system();
    ring->published = n + 1;
    st->published = n + 1;
    const int n_stop = min(v.n_stop_ids, (int)ARC_MAX_STOP_IDS);
    for (int k = 0; k < n_stop; ++k) {
        if (v.stop_ids[k] == tok) {
            // After the count: a host that sees the stop mark also sees the stop token.
            st->stopped = v.burst;
            __threadfence_system();
            ring->stopped = v.burst;
            break;
        }
    }
}
