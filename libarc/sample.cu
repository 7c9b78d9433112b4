// sample.cu -- the sampled step's sampler: one token drawn from the logits by temperature, top-k and
// top-p (the definition is arc.h's, at arc_sample, and arcpy/sampling.py's), as a standalone
// entry point and, in the device loop's sampled step graph, with the commit in the thread that
// finds the token. Up to 65,536 ids it runs inside one thread-block cluster (sample_cluster.cu),
// above over co-resident blocks (here).
#include <limits.h>
#include <math.h>

#include "grid_sync.cuh"
#include "sample.cuh"

// One grid of co-resident blocks (at most the occupancy times the SM count), each thread holding
// E consecutive ids in registers, so the ids run in order block by block, thread by thread. The
// selections are radix searches on the logits' order keys: a level histograms one digit of the
// key (counts and integer masses) over the ids still in play, sums it over the grid with integer
// atomics, and every block picks the same bucket from the same sums; ties at the final key are
// split by ascending id with an ordered search. Integer sums make every launch deterministic.
// Grid barriers count arrivals in DrawScratch.

enum { DRAW_THREADS = 256, DRAW_WARPS = DRAW_THREADS / 32, DRAW_LEVELS = 3 };

// One radix level: the histogram of digit (key >> shift) & (2^bits - 1) over the ids `play`
// admits, summed over the grid, then the bucket holding the want-th unit of count (or of mass),
// counted from the largest keys down. With p32 != 0 want is ceil(total mass * p32 / 2^32).
template <int E, typename Play>
__device__ Pick radix_level(DrawScratch *s, int level, const uint32_t (&key)[E], const unsigned long long (&q)[E],
                            Play play, int shift, int bits, bool by_mass, unsigned long long want, uint64_t p32,
                            BlockHistogram *h) {
    const int nb = 1 << bits;
    h->clear(DRAW_THREADS);
    __syncthreads();
#pragma unroll
    for (int e = 0; e < E; ++e) {
        if (play(e)) {
            h->add((key[e] >> shift) & (uint32_t)(nb - 1), q[e]);
        }
    }
    __syncthreads();
    const int buf = level % 3, next = (level + 1) % 3;
    for (int b = threadIdx.x; b < nb; b += DRAW_THREADS) {
        if (h->count[b]) atomicAdd(&s->count[buf][b], h->count[b]);
        unsigned long long m = h->mass(b);
        if (m) atomicAdd(&s->mass[buf][b], m);
    }
    // The buffer after this one was last read two levels ago: clear it for the next level.
    for (int i = blockIdx.x * DRAW_THREADS + threadIdx.x; i < DRAW_BINS; i += gridDim.x * DRAW_THREADS) {
        s->count[next][i] = 0;
        s->mass[next][i] = 0;
    }
    grid_sync(&s->bar_count);
    // Thread t holds `per` consecutive buckets from the top, loaded together (one round trip);
    // a block scan of their sums finds the crossing.
    constexpr int MAX_PER = DRAW_BINS / DRAW_THREADS;
    const int per = nb / DRAW_THREADS;
    uint32_t cnt[MAX_PER];
    unsigned long long mass[MAX_PER];
#pragma unroll
    for (int j = 0; j < MAX_PER; ++j) {
        int b = nb - 1 - (threadIdx.x * per + j);
        cnt[j] = j < per ? __ldcg(&s->count[buf][b]) : 0u;
        mass[j] = j < per ? __ldcg(&s->mass[buf][b]) : 0ull;
    }
    unsigned long long local = 0;
#pragma unroll
    for (int j = 0; j < MAX_PER; ++j) local += by_mass ? mass[j] : cnt[j];
    unsigned long long total;
    unsigned long long before = block_scan<DRAW_THREADS>(local, &total);
    if (p32) {
        unsigned long long hi = __umul64hi(total, p32 << 32);
        want = hi + (((total * p32) & 0xffffffffull) != 0);
    }
    __shared__ Pick pick;
    if (before < want && want <= before + local) {
        unsigned long long acc = before;
        bool done = false;
#pragma unroll
        for (int j = 0; j < MAX_PER; ++j) {
            unsigned long long v = by_mass ? mass[j] : cnt[j];
            if (!done && acc + v >= want) {
                pick = Pick{(uint32_t)(nb - 1 - (threadIdx.x * per + j)), cnt[j], acc, mass[j], want};
                done = true;
            }
            acc += v;
        }
    }
    __syncthreads();
    Pick r = pick;
    __syncthreads();
    return r;
}

// The first id, in ascending id order, at which the running sum of weight(e) exceeds target
// (with x != 0 or `draw`, target = floor(grid total * x / 2^32)). Only the thread that holds that
// id gets it; every other thread gets -1.
template <int E, typename Weight>
__device__ int ordered_find(DrawScratch *s, int base, Weight weight, unsigned long long target, bool draw,
                            uint32_t x) {
    unsigned long long local = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) local += weight(e);
    unsigned long long block_total;
    unsigned long long excl = block_scan<DRAW_THREADS>(local, &block_total);
    if (threadIdx.x == 0) s->block_sum[blockIdx.x] = block_total;
    grid_sync(&s->bar_count);
    unsigned long long before_part = 0, all_part = 0;
    for (int j = threadIdx.x; j < (int)gridDim.x; j += DRAW_THREADS) {
        unsigned long long v = __ldcg(&s->block_sum[j]);
        all_part += v;
        if (j < (int)blockIdx.x) before_part += v;
    }
    unsigned long long before_block, all;
    block_scan<DRAW_THREADS>(before_part, &before_block);
    block_scan<DRAW_THREADS>(all_part, &all);
    if (draw) target = __umul64hi(all, (unsigned long long)x << 32);
    return find_in_thread<E>(base, weight, before_block + excl, local, target);
}

// The id one thread found, in every block.
__device__ int broadcast_found(DrawScratch *s, int found) {
    if (found >= 0) s->found = found;
    grid_sync(&s->bar_count);
    return __ldcg(&s->found);
}

template <int E, bool COMMIT>
__global__ void __launch_bounds__(DRAW_THREADS, 2)
    draw_kernel(const float *__restrict__ logits, int n, DrawParams p, DrawScratch *s, CommitArgs c, int32_t *out) {
    __shared__ BlockHistogram hist;
    __shared__ uint32_t warp_max[DRAW_WARPS], warp_low[DRAW_WARPS];
    pdl_wait();  // the logits and the loop's state come from the kernels before
    if (COMMIT) params_from_state(c.st, &p);
    const int base = (blockIdx.x * DRAW_THREADS + threadIdx.x) * E;
    float l[E];
    uint32_t key[E];
    unsigned long long q[E];
    uint32_t low;
    uint32_t kmax = load_keys<E>(logits, n, base, l, key, low);
    if (threadIdx.x % 32 == 0) {
        warp_max[threadIdx.x / 32] = kmax;
        warp_low[threadIdx.x / 32] = low;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < DRAW_WARPS; ++w) {
            kmax = max(kmax, warp_max[w]);
            low = max(low, warp_low[w]);
        }
        atomicMax(&s->max_key, kmax);
        atomicMax(&s->low_key, low);
    }
    grid_sync(&s->bar_count);
    const uint32_t top = __ldcg(&s->max_key);
    const uint32_t low_all = __ldcg(&s->low_key);
    const float m = key_value(top);
    if (nonfinite(m)) {
        // NaN anywhere, +inf, or nothing but -inf: the forward broke; the commit latches it.
        if (blockIdx.x == 0 && threadIdx.x == 0) publish<COMMIT>(c, p, out, -1, top, ~top ^ 1u);
    } else {
#pragma unroll
        for (int e = 0; e < E; ++e)
            q[e] = base + e < n ? __float2ull_rn(__fmul_rn(exp32(__fmul_rn(__fsub_rn(l[e], m), p.inv_t)), 0x1p40f)) : 0ull;

        // The key's digits, top down: bits 31-21, 20-10, 9-0.
        auto shift_of = [](int lv) { return lv == 0 ? 21 : lv == 1 ? 10 : 0; };
        auto width_of = [](int lv) { return lv == 2 ? 10 : 11; };
        int level = 0;
        auto in_play = [&](int e, uint32_t prefix, int lv) {
            int hi = shift_of(lv) + width_of(lv);
            return base + e < n && (hi >= 32 || (key[e] >> hi) == (prefix >> hi));
        };

        // Top-k: kept_k(id) = key > k_key, or key == k_key and id <= k_id.
        bool k_on = p.top_k > 0 && p.top_k < n;
        uint32_t k_key = 0;
        int k_id = INT_MAX;
        if (k_on) {
            uint32_t prefix = 0;
            unsigned long long want = (unsigned long long)p.top_k;  // the rank of the last kept id
            bool whole = false;
            for (int lv = 0; lv < DRAW_LEVELS && !whole; ++lv) {
                Pick pk = radix_level<E>(s, level++, key, q, [&](int e) { return in_play(e, prefix, lv); },
                                         shift_of(lv), width_of(lv), false, want, 0, &hist);
                prefix |= pk.digit << shift_of(lv);
                want -= pk.above;
                whole = want == pk.count;  // the whole bucket is kept: key >= prefix
            }
            k_key = prefix;
            if (!whole) {
                int f = ordered_find<E>(s, base, [&](int e) { return (unsigned long long)(base + e < n && key[e] == k_key); },
                                        want - 1, false, 0);
                k_id = broadcast_found(s, f);
            }
        }
        auto kept_k = [&](int e) {
            return !k_on || key[e] > k_key || (key[e] == k_key && base + e <= k_id);
        };

        // Top-p over the top-k set: the shortest prefix of it holding ceil(S * p32 / 2^32).
        bool p_on = p.p32 < (1ull << 32);
        uint32_t p_key = 0;
        int p_id = INT_MAX;
        if (p_on) {
            uint32_t prefix = 0;
            unsigned long long want = 0;
            bool whole = false;
            for (int lv = 0; lv < DRAW_LEVELS && !whole; ++lv) {
                Pick pk = radix_level<E>(s, level++, key, q,
                                         [&](int e) { return in_play(e, prefix, lv) && kept_k(e); }, shift_of(lv),
                                         width_of(lv), true, want, lv == 0 ? p.p32 : 0, &hist);
                if (lv == 0) want = pk.want;
                prefix |= pk.digit << shift_of(lv);
                want -= pk.above;
                // One id, or all of the bucket's mass needed: the prefix ends in this bucket.
                whole = pk.count == 1 || want == pk.mass;
            }
            p_key = prefix;
            if (!whole) {
                int f = ordered_find<E>(
                    s, base, [&](int e) { return base + e < n && key[e] == p_key && kept_k(e) ? q[e] : 0ull; },
                    want - 1, false, 0);
                p_id = broadcast_found(s, f);
            }
        }

        // The draw, in ascending id order over what is kept.
        uint32_t x = philox_word0((uint64_t)p.position, p.seed);
        int tok = ordered_find<E>(
            s, base,
            [&](int e) {
                bool kept = base + e < n && kept_k(e) &&
                            (!p_on || key[e] > p_key || (key[e] == p_key && base + e <= p_id));
                return kept ? q[e] : 0ull;
            },
            0, true, x);
        if (tok >= 0) publish<COMMIT>(c, p, out, tok, top, low_all);
    }
    // The last block out leaves the scratch as the next launch expects it.
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&s->exit_count, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last) {
        for (int i = threadIdx.x; i < DRAW_BINS; i += DRAW_THREADS) {
            s->count[0][i] = 0;
            s->mass[0][i] = 0;
        }
        if (threadIdx.x == 0) {
            s->max_key = 0;
            s->low_key = 0;
            s->bar_count = 0;
            s->exit_count = 0;
        }
    }
}

// The most blocks of draw_kernel<E> that are resident at once: the grid barrier needs them all.
template <int E, bool COMMIT>
static int draw_capacity(arc_context *ctx, int *blocks) {
    int per_sm = 0;
    ARC_CUDA(ctx, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, draw_kernel<E, COMMIT>, DRAW_THREADS, 0));
    *blocks = per_sm * ctx->sm_count < DRAW_MAX_BLOCKS ? per_sm * ctx->sm_count : DRAW_MAX_BLOCKS;
    return ARC_OK;
}

template <int E, bool COMMIT>
static int try_draw(arc_context *ctx, const DrawJob &d, bool *launched) {
    int cap = 0;
    int st = draw_capacity<E, COMMIT>(ctx, &cap);
    if (st != ARC_OK) return st;
    int blocks = (d.n + DRAW_THREADS * E - 1) / (DRAW_THREADS * E);
    *launched = blocks <= cap;
    if (!*launched) return ARC_OK;
    return arc_launch_pdl(ctx, COMMIT ? "draw_commit_kernel" : "draw_kernel", draw_kernel<E, COMMIT>, dim3(blocks),
                          dim3(DRAW_THREADS), 0, d.logits, d.n, d.p, ctx->draw, d.c, d.out);
}

// In one cluster where the vocabulary fits it, else over co-resident blocks; as few ids per
// thread as either allows.
template <bool COMMIT>
static int launch_draw(arc_context *ctx, const float *logits, int32_t n, const DrawParams &p, const CommitArgs &c,
                       int32_t *out) {
    ARC_REQUIRE(logits, "null logits");
    ARC_REQUIRE(n > 0, "n must be positive, got %d", n);
    bool launched = false;
    const DrawJob d{.logits = logits, .n = n, .p = p, .c = c, .out = out};
    int st = try_draw_cluster(ctx, d, COMMIT, &launched);
    if (st == ARC_OK && !launched) st = try_draw<4, COMMIT>(ctx, d, &launched);
    if (st == ARC_OK && !launched) st = try_draw<8, COMMIT>(ctx, d, &launched);
    if (st == ARC_OK && !launched) st = try_draw<16, COMMIT>(ctx, d, &launched);
    if (st == ARC_OK && !launched) {
        int32_t most = 0;
        st = arc_sample_max_vocab(ctx, &most);
        if (st == ARC_OK)
            return arc_fail(ARC_INVALID_ARGUMENT, __func__, "vocabulary %d exceeds the draw's %d on this device", n,
                            most);
    }
    return st;
}

extern "C" int arc_sample_max_vocab(arc_context *ctx, int32_t *out) {
    ARC_REQUIRE(ctx && out, "null argument");
    int cap = 0;
    int st = draw_capacity<16, true>(ctx, &cap);
    if (st != ARC_OK) return st;
    int cap_test = 0;
    st = draw_capacity<16, false>(ctx, &cap_test);
    if (st != ARC_OK) return st;
    *out = (cap < cap_test ? cap : cap_test) * DRAW_THREADS * 16;
    return ARC_OK;
}

// The parameters in the draw's terms, each checked.
static int arc_draw_params(const arc_sampling *s, DrawParams *p) {
    ARC_REQUIRE(s, "sampling is null");
    float inv_t = (float)(1.0 / s->temperature);
    ARC_REQUIRE(isfinite(s->temperature) && s->temperature > 0.0 && isfinite(inv_t) && inv_t > 0.0f,
                "temperature must be positive and finite, with a finite float32 inverse; got %g", s->temperature);
    ARC_REQUIRE(s->top_p > 0.0 && s->top_p <= 1.0, "top_p must be in (0, 1], got %g", s->top_p);
    ARC_REQUIRE(s->top_k >= 0, "top_k must be >= 0, got %d", s->top_k);
    p->inv_t = inv_t;
    p->top_k = s->top_k;
    long long p32 = llrint(s->top_p * 4294967296.0);  // exact product, rounded half to even
    p->p32 = p32 < 1 ? 1 : (uint64_t)p32;
    p->seed = s->seed;
    p->position = 0;
    return ARC_OK;
}

extern "C" int arc_sample(arc_context *ctx, const float *logits, int32_t n, const arc_sampling *sampling,
                          int64_t position, int32_t *out) {
    ARC_REQUIRE(ctx && out, "null argument");
    ARC_REQUIRE(position >= 0, "position must be >= 0, got %lld", (long long)position);
    DrawParams p = {};
    int st = arc_draw_params(sampling, &p);
    if (st != ARC_OK) return st;
    p.position = position;
    return launch_draw<false>(ctx, logits, n, p, CommitArgs{}, out);
}

// --- In the sampled step graph -----------------------------------------------------------

// Enqueues the draw over the loop's vocabulary (the valid ids: padding is never drawn) with the
// commit in the thread that finds the token: the sampled step graph.
extern "C" int arc_loop_enqueue_draw_commit(arc_loop *loop, const float *logits, int32_t width) {
    ARC_REQUIRE(loop, "loop is null");
    ARC_REQUIRE(loop->vocab <= width, "loop vocab %d exceeds the logits' width %d", loop->vocab, width);
    arc_context *ctx = loop->ctx;
    DrawParams unused = {};
    int st = launch_draw<true>(ctx, logits, loop->vocab, unused, commit_args(loop), nullptr);
    if (st == ARC_OK && ctx->capturing) ctx->capture_commits = loop;
    return st;
}

int enqueue_row_draw(arc_loop *loop, const float *logits, int row, int rows, unsigned long long *keys) {
    DrawParams p = {};
    p.keys = keys;
    p.row = row;
    p.rows = rows;
    return launch_draw<true>(loop->ctx, logits, loop->vocab, p, commit_args(loop), nullptr);
}

__global__ void set_sampling_kernel(DeviceState *st, DrawParams p) {
    st->inv_temperature = p.inv_t;
    st->top_k = p.top_k;
    st->top_p32 = p.p32;
    st->seed = p.seed;
}

// The sequence's sampling parameters (arc_loop_begin_sequence, ARC_SEQ_SAMPLING).
int loop_set_sampling(arc_loop *loop, const arc_sampling *sampling) {
    DrawParams p = {};
    int st = arc_draw_params(sampling, &p);
    if (st != ARC_OK) return st;
    arc_context *ctx = loop->ctx;
    set_sampling_kernel<<<1, 1, 0, ctx->stream>>>(loop->state, p);
    ARC_LAUNCHED(ctx, "set_sampling_kernel");
    return ARC_OK;
}
