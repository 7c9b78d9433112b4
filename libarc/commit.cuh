// commit.cuh -- the commit: what the device loop's samplers (the argmax, sampler.cu, or inside the
// lm_head, model/gemv.cu; the draw, draw.cu) do with the token they chose. One thread of the
// sampler's grid calls commit_token once per step.
#pragma once

#include "internal.cuh"

// Where a step's commit writes: the loop's device state and its pinned, mapped ring.
struct CommitArgs {
    DeviceState *st;
    RingHeader *ring;
    int32_t *slots;
    int32_t *history;
    int vocab, max_seq, capacity;
};

// The commit arguments of a loop's step graphs.
inline CommitArgs commit_args(arc_loop *loop) {
    return CommitArgs{loop->state, loop->ring_dev, loop->slots_dev, loop->history, loop->vocab, loop->max_seq,
                      loop->capacity};
}

// True for NaN and +-inf: the exponent bits all set. A bit test, so no compiler flag can fold it.
__device__ __forceinline__ bool nonfinite(float v) {
    return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}

// Whether this step's commit may publish: no fault latched, no stop id ended the burst, the
// burst's limit not reached.
__device__ __forceinline__ bool will_publish(const CommitArgs &c) {
    const DeviceState *st = c.st;
    return st->fault == 0 && st->stopped != st->burst && st->published != st->limit;
}

// Latches fault `code` (sticky: later steps publish nothing): the device's copy, then the ring's
// detail, a system-wide fence, and the ring's word, so a host that sees the word sees the detail.
__device__ inline void latch_fault(const CommitArgs &c, uint32_t code, int tok, int pos) {
    c.st->fault = code;
    c.ring->fault_token = tok;
    c.ring->fault_pos = pos;
    __threadfence_system();
    c.ring->fault = code;
}

// Checks the sampled token, the logit that decided it (the argmax's winner, the draw's maximum),
// whether every logit the sampler saw was equal (`flat`: its smallest equals its largest), and the
// next position before writing anything; on a violation latches the fault word (sticky: later
// steps publish nothing). A non-finite logit is checked first: NaN wins the argmax wherever it
// lies, so a broken forward is reported as broken, not as a token out of range. Flat logits over
// a vocabulary of more than one token are the forward's fault too: zero or saturated weights
// that carry no information, which would otherwise decode token 0 for ever. Otherwise
// feeds the token to the next forward, bumps the position, and publishes the token: slot first,
// then a system-wide fence, then the count, so a host that sees the count sees the slot. A stop
// id ends the burst: later steps of the same burst publish nothing, as do those past the burst's
// limit of tokens. The token also goes into the history at its position (drafts read it).
// Returns whether the token was published.
__device__ inline bool publish_token(const CommitArgs &c, int tok, float value, bool flat) {
    DeviceState *st = c.st;
    RingHeader *ring = c.ring;
    volatile int32_t *slots = c.slots;
    if (!will_publish(c)) return false;
    int next = st->position + 1;
    uint32_t code = ARC_FAULT_NONE;
    if (nonfinite(value)) code = ARC_FAULT_NONFINITE;
    else if (flat && c.vocab > 1) code = ARC_FAULT_DEGENERATE;
    else if (tok < 0 || tok >= c.vocab) code = ARC_FAULT_TOKEN_RANGE;
    else if (next >= c.max_seq) code = ARC_FAULT_POSITION_RANGE;
    if (code != ARC_FAULT_NONE) {
        latch_fault(c, code, tok, next);
        return false;
    }
    st->token = (uint32_t)tok;
    st->position = next;
    c.history[next] = tok;
    uint32_t n = st->published;
    slots[n % (uint32_t)c.capacity] = tok;
    __threadfence_system();
    ring->published = n + 1;
    st->published = n + 1;
    for (int k = 0; k < st->n_stop_ids; ++k) {
        if (st->stop_ids[k] == tok) {
            // After the count: a host that sees the stop mark also sees the stop token.
            st->stopped = st->burst;
            __threadfence_system();
            ring->stopped = st->burst;
            break;
        }
    }
    return true;
}

// True when fault injection says this commit is lost (as if its launch never ran).
__device__ inline bool commit_lost(const CommitArgs &c) {
    DeviceState *st = c.st;
    return st->lose_in >= 0 && st->lose_in-- == 0;
}

// The commit of a one-token step.
__device__ inline void commit_token(const CommitArgs &c, int tok, float value, bool flat) {
    if (commit_lost(c)) return;
    publish_token(c, tok, value, flat);
}
