// sample.cuh -- what the two draws share (sample.cu's over co-resident blocks, sample_cluster.cu's
// inside one thread-block cluster): their parameters, block scans and histograms, loading the
// keys, finding the crossing in a thread, publishing the token; and the cluster draw's launcher.
#pragma once

#include <limits.h>
#include <stdint.h>

#include "commit.cuh"
#include "device_math.cuh"
#include "internal.cuh"
#include "launch.cuh"
#include "sample_math.cuh"

struct DrawParams {
    float inv_t;
    int32_t top_k;     // 0: off
    uint64_t p32;      // 2^32: off
    uint64_t seed;
    int64_t position;  // the drawn token's position: the Philox counter
    // A speculative step's row (speculate.cu), in the step graph only: the draw is that of the
    // token after verify row `row` (its position the loop's + 1 + row) and, in place of the
    // commit, leaves the row's pair of keys for the accept, as its greedy argmax would. keys null:
    // the plain draw.
    unsigned long long *keys;
    int32_t row, rows;
};

// Exclusive prefix of v over the block's THREADS threads; *total gets the block's sum.
template <int THREADS>
__device__ unsigned long long block_scan(unsigned long long v, unsigned long long *total) {
    constexpr int WARPS = THREADS / 32;
    __shared__ unsigned long long warp_sum[WARPS];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned long long inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        unsigned long long y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    if (lane == 31) warp_sum[warp] = inc;
    __syncthreads();
    unsigned long long before = 0, all = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        if (w < warp) before += warp_sum[w];
        all += warp_sum[w];
    }
    __syncthreads();
    *total = all;
    return before + inc - v;
}

// A mass from its three 32-bit parts (BlockHistogram's).
__device__ __forceinline__ unsigned long long mass_of_parts(uint32_t lo, uint32_t mid, uint32_t hi) {
    return lo + ((unsigned long long)mid << 14) + ((unsigned long long)hi << 28);
}

// A block's histogram of counts and integer masses in shared memory. Each mass is kept in three
// 32-bit parts (a weight's bits 0-13, 14-27 and 28-40), so every add is the native 32-bit shared
// atomic: a 64-bit one is a compare-and-swap loop that spins while lanes add into one bin. A part's
// sum stays exact up to 2^18 adds per bin; a block adds at most 4,096.
struct BlockHistogram {
    uint32_t count[DRAW_BINS];
    uint32_t part[3][DRAW_BINS];

    __device__ void clear(int threads) {
        for (int b = threadIdx.x; b < DRAW_BINS; b += threads) {
            count[b] = 0;
            part[0][b] = part[1][b] = part[2][b] = 0;
        }
    }
    __device__ void add(uint32_t d, unsigned long long q) {
        atomicAdd(&count[d], 1u);
        uint32_t lo = (uint32_t)q & 0x3FFFu, mid = (uint32_t)(q >> 14) & 0x3FFFu, hi = (uint32_t)(q >> 28);
        if (lo) atomicAdd(&part[0][d], lo);
        if (mid) atomicAdd(&part[1][d], mid);
        if (hi) atomicAdd(&part[2][d], hi);
    }
    __device__ unsigned long long mass(int b) const {
        return mass_of_parts(part[0][b], part[1][b], part[2][b]);
    }
};

struct Pick {
    uint32_t digit;
    uint32_t count;             // ids in play in the picked bucket
    unsigned long long above;   // count or mass (by what was searched) in the buckets above it
    unsigned long long mass;    // their mass
    unsigned long long want;    // the searched-for amount (computed at a top-p search's first level)
};

// Of the running sum of weight(e) over this thread's ids, from acc (the sum before them; local is
// theirs), the id at which it first exceeds target, where that lies among them; else -1.
template <int E, typename Weight>
__device__ int find_in_thread(int base, Weight weight, unsigned long long acc, unsigned long long local,
                              unsigned long long target) {
    int found = -1;
    if (acc <= target && target < acc + local) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
            acc += weight(e);
            if (found < 0 && acc > target) found = base + e;
        }
    }
    return found;
}

// The loop's sampling parameters, from its device state (the sampled step graph), at the position
// after the verify row p->row (0 in a plain step). Read before the draw's first barrier: the
// commit, after its last, moves the position on.
__device__ __forceinline__ void params_from_state(const DeviceState *st, DrawParams *p) {
    p->inv_t = st->inv_temperature;
    p->top_k = st->top_k;
    p->p32 = st->top_p32;
    p->seed = st->seed;
    p->position = (int64_t)st->position + 1 + p->row;
}

// Ids [base, base + E): their logits (-0 made +0, 0 past n) and order keys (NaN above all, 0 past
// n), read through L2. Returns the warp's largest key, and in `low` the warp's largest ~key of an
// id below n: the smallest logit's (the commit latches flat logits where the two meet).
template <int E>
__device__ uint32_t load_keys(const float *__restrict__ logits, int n, int base, float (&l)[E], uint32_t (&key)[E],
                              uint32_t &low) {
    uint32_t kmax = 0;
    low = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        float v = base + e < n ? __ldcg(&logits[base + e]) + 0.0f : 0.0f;
        l[e] = v;
        key[e] = base + e >= n ? 0u : (v != v ? 0xFFFFFFFFu : order_key(v));
        kmax = max(kmax, key[e]);
        if (base + e < n) low = max(low, ~key[e]);
    }
    low = __reduce_max_sync(0xffffffffu, low);
    return __reduce_max_sync(0xffffffffu, kmax);
}

// The drawn token: the commit in the loop's step graph (or a verify row's keys), else *out
// (visible to the host once the launch is done); -1 when the logits broke. kmax: the largest order
// key of the logits, low: the largest ~key (every logit equal where kmax == ~low).
template <bool COMMIT>
__device__ void publish(const CommitArgs &c, const DrawParams &p, int32_t *out, int tok, uint32_t kmax,
                        uint32_t low) {
    if (COMMIT && p.keys) {  // a verify row: speculate.cu's rowmax_kernel's pair, with the drawn token
        p.keys[p.row] = (unsigned long long)kmax << 32 | ~(uint32_t)(tok < 0 ? 0 : tok);
        p.keys[p.rows + p.row] = low;
    } else if (COMMIT) {
        commit_token(c, tok < 0 ? 0 : tok, key_value(kmax), tok >= 0 && kmax == ~low);
    } else {
        *(volatile int32_t *)out = tok;
        __threadfence_system();
    }
}

// One draw: from logits[0..n) under p, committed through c (COMMIT) or written to *out.
struct DrawJob {
    const float *logits = nullptr;
    int n = 0;
    DrawParams p{};
    CommitArgs c{};
    int32_t *out = nullptr;
};
// Enqueues the draw inside one thread-block cluster where the vocabulary fits one on this device
// at 4 or 8 ids a thread (sample_cluster.cu); *launched says whether it did.
int try_draw_cluster(arc_context *ctx, const DrawJob &d, bool commit, bool *launched);
// Enqueues, in the speculative step graph, the draw after verify row `row` of `rows` over the
// loop's vocabulary: logits the row's, its key pair into keys (speculate.cu's accept).
int enqueue_row_draw(arc_loop *loop, const float *logits, int row, int rows, unsigned long long *keys);
