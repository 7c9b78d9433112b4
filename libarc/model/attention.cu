// attention.cu -- one token's attention over the bf16 KV cache, split across blocks
// (flash-decoding): each block scores one chunk of positions for a few query heads and writes a
// partial result (its max, its sum of exponentials, its unnormalized output); the last block of
// a head group to finish combines the group's partials, so one kernel does both. The grid
// covers max_seq, fixed when a graph is captured; the position is read on the device and chunks
// past it exit at once, so there is no host decision per position.
#include <math.h>

#include "kernels.cuh"

enum { ATTN_THREADS = 128, ATTN_WARPS = ATTN_THREADS / 32, ATTN_UNROLL = 8 };

// VEC bf16 values of a cache row as floats: 16-byte loads when head_dim % 8 == 0, else 4-byte.
template <int VEC>
__device__ __forceinline__ void load_row(const uint16_t *p, float *f) {
    if constexpr (VEC == 8) {
        const uint4 g = *reinterpret_cast<const uint4 *>(p);
        f[0] = bf16_lo(g.x); f[1] = bf16_hi(g.x); f[2] = bf16_lo(g.y); f[3] = bf16_hi(g.y);
        f[4] = bf16_lo(g.z); f[5] = bf16_hi(g.z); f[6] = bf16_lo(g.w); f[7] = bf16_hi(g.w);
    } else {
        const uint32_t g = *reinterpret_cast<const uint32_t *>(p);
        f[0] = bf16_lo(g); f[1] = bf16_hi(g);
    }
}

// ATTN_UNROLL cache rows of a chunk, rows tb + pg * u + pw (u < ATTN_UNROLL), this lane's NV
// vectors of each (vector j = sub + lp * i of the row); rows at or past n, and vectors past
// the row's nvh, read as zeros.
template <int VEC, int NV>
__device__ __forceinline__ void load_tile(const uint16_t *rows, int hd, int nvh, int n, int tb, int pg,
                                          int pw, int lp, int sub, float (&f)[ATTN_UNROLL][NV * VEC]) {
#pragma unroll
    for (int u = 0; u < ATTN_UNROLL; ++u) {
        const int t = tb + pg * u + pw;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const int j = sub + lp * i;
            if (t < n && j < nvh) {
                load_row<VEC>(rows + (size_t)t * hd + j * VEC, &f[u][i * VEC]);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) f[u][i * VEC + e] = 0.0f;
            }
        }
    }
}

// Partial attention of query heads [G * blockIdx.x, +G) (they share one kv head) over the
// positions [ATTN_CHUNK * blockIdx.y, +ATTN_CHUNK) that are <= *pos.
// q (n_heads, hd) f32; k_cache, v_cache (n_kv_heads, max_seq, hd) bf16, this layer's.
// Writes o_part[head][split][hd] = sum_t exp(s_t - m) v_t and ml_part[head][split] = (m, sum_t
// exp(s_t - m)), where s_t = (q . k_t) / sqrt(hd) and m is the chunk's max score. The last of
// the group's ns = pos / ATTN_CHUNK + 1 blocks to finish (a ticket on done[blockIdx.x], which it
// resets) writes out[head][d] = sum_s exp(m_s - M) o_s[d] / sum_s exp(m_s - M) l_s, M = max_s
// m_s, summing the chunks in order. A position outside [0, max_seq) makes out NaN.
// Launch: grid (n_heads / G, ceil(max_seq / ATTN_CHUNK)), ATTN_THREADS threads. LP lanes share a
// position, each holding NV vectors of VEC elements of the head row; a warp holds 32 / LP
// positions. Limits: hd even and <= 128 (VEC = 8 needs hd % 8 == 0), G <= ATTN_WARPS.
template <int VEC, int LP, int G>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_split_kernel(const float *__restrict__ q, const uint16_t *__restrict__ k_cache,
                       const uint16_t *__restrict__ v_cache, int group, int hd, int max_seq,
                       int splits, const int32_t *__restrict__ pos_ptr, float scale,
                       float *__restrict__ o_part, float2 *__restrict__ ml_part, unsigned *done,
                       float *__restrict__ out) {
    constexpr int NV = VEC == 8 ? 1 : 2;  // VEC == 2 runs with LP == 32: hd / 2 <= 64 = 32 * NV
    constexpr int E = NV * VEC;           // elements of a head row per lane
    constexpr int PPW = 32 / LP;          // positions per warp
    constexpr int PG = ATTN_THREADS / LP; // positions per block step
    __shared__ float sc[G][ATTN_CHUNK];
    __shared__ float red[ATTN_WARPS][G][ATTN_MAX_HEAD_DIM];
    __shared__ float2 stat[G];

    pdl_launch_dependents();
    pdl_wait();
    const int pos = *pos_ptr;
    if (pos < 0 || pos >= max_seq) {
        if (blockIdx.y == 0)
            for (int idx = threadIdx.x; idx < G * hd; idx += ATTN_THREADS)
                out[(size_t)blockIdx.x * G * hd + idx] = __uint_as_float(0x7fc00000u);
        return;
    }
    const int split = blockIdx.y, start = split * ATTN_CHUNK;
    if (start > pos) return;
    const int n = min(ATTN_CHUNK, pos + 1 - start);
    const int head0 = blockIdx.x * G, kvh = head0 / group;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int sub = lane % LP, pw = lane / LP;
    const int nvh = hd / VEC;  // vectors per head row

    float qf[G][E];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const int j = sub + LP * i;
#pragma unroll
            for (int e = 0; e < VEC; ++e)
                qf[g][i * VEC + e] = j < nvh ? q[(size_t)(head0 + g) * hd + j * VEC + e] : 0.0f;
        }
    const size_t base = ((size_t)kvh * max_seq + start) * hd;
    const uint16_t *kb = k_cache + base, *vb = v_cache + base;

    // Scores. The loop bound is uniform over the warp, so the shuffles below see every lane.
    for (int tb = warp * PPW; tb < n; tb += PG * ATTN_UNROLL) {
        float kf[ATTN_UNROLL][E];
        load_tile<VEC, NV>(kb, hd, nvh, n, tb, PG, pw, LP, sub, kf);
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            const int t = tb + PG * u + pw;
            float d[G];
#pragma unroll
            for (int g = 0; g < G; ++g) {
                d[g] = 0.0f;
#pragma unroll
                for (int e = 0; e < E; ++e) d[g] = fmaf(qf[g][e], kf[u][e], d[g]);
#pragma unroll
                for (int off = LP / 2; off > 0; off >>= 1) d[g] += __shfl_xor_sync(0xffffffffu, d[g], off);
            }
            if (sub == 0 && t < n) {
#pragma unroll
                for (int g = 0; g < G; ++g) sc[g][t] = d[g] * scale;
            }
        }
    }
    __syncthreads();

    // Softmax statistics of the chunk: warp g takes head g.
    if (warp < G) {
        float m = -INFINITY;
        for (int t = lane; t < n; t += 32) m = fmaxf(m, sc[warp][t]);
        m = warp_max(m);
        float l = 0.0f;
        for (int t = lane; t < n; t += 32) {
            const float p = expf(sc[warp][t] - m);
            sc[warp][t] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) stat[warp] = make_float2(m, l);
    }
    __syncthreads();

    // Weighted sum of v: each lane accumulates its share of positions, then lanes and warps that
    // hold the same elements are summed.
    float acc[G][E];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
    for (int tb = warp * PPW; tb < n; tb += PG * ATTN_UNROLL) {
        float vf[ATTN_UNROLL][E];
        load_tile<VEC, NV>(vb, hd, nvh, n, tb, PG, pw, LP, sub, vf);
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            const int t = tb + PG * u + pw;
            if (t < n) {
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    const float p = sc[g][t];
#pragma unroll
                    for (int e = 0; e < E; ++e) acc[g][e] = fmaf(p, vf[u][e], acc[g][e]);
                }
            }
        }
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int e = 0; e < E; ++e)
#pragma unroll
            for (int off = LP; off < 32; off <<= 1) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], off);
    if (pw == 0) {
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const int j = sub + LP * i;
            if (j < nvh) {
#pragma unroll
                for (int g = 0; g < G; ++g)
#pragma unroll
                    for (int e = 0; e < VEC; ++e) red[warp][g][j * VEC + e] = acc[g][i * VEC + e];
            }
        }
    }
    __syncthreads();
    for (int idx = tid; idx < G * hd; idx += ATTN_THREADS) {
        const int g = idx / hd, d = idx % hd;
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; ++w) o += red[w][g][d];
        o_part[((size_t)(head0 + g) * splits + split) * hd + d] = o;
    }
    if (tid < G) ml_part[(size_t)(head0 + tid) * splits + split] = stat[tid];

    // Every thread's partials are visible device-wide before the block takes its ticket.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    const int ns = pos / ATTN_CHUNK + 1;
    if (tid == 0) last = atomicAdd(&done[blockIdx.x], 1u) == (unsigned)(ns - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int idx = tid; idx < G * hd; idx += ATTN_THREADS) {
        const int head = head0 + idx / hd, d = idx % hd;
        const float2 *ml = ml_part + (size_t)head * splits;
        const float *op = o_part + (size_t)head * splits * hd + d;
        float m = -INFINITY;
        for (int c = 0; c < ns; ++c) m = fmaxf(m, __ldcg(&ml[c].x));
        float l = 0.0f, o = 0.0f;
        for (int c = 0; c < ns; ++c) {
            const float2 st = __ldcg(&ml[c]);
            const float w = expf(st.x - m);
            l = fmaf(w, st.y, l);
            o = fmaf(w, __ldcg(op + (size_t)c * hd), o);
        }
        out[(size_t)head * hd + d] = o / l;
    }
    if (tid == 0) done[blockIdx.x] = 0;
}

static int attention_splits(int32_t max_seq) { return (max_seq + ATTN_CHUNK - 1) / ATTN_CHUNK; }

uint64_t arc_attention_scratch_bytes(int32_t n_heads, int32_t head_dim, int32_t max_seq) {
    if (n_heads <= 0 || head_dim <= 0 || max_seq <= 0) return 0;
    const uint64_t parts = (uint64_t)n_heads * attention_splits(max_seq);
    return parts * head_dim * sizeof(float) + parts * sizeof(float2);
}

// What every variant of the split kernel is launched with.
struct SplitArgs {
    dim3 grid;
    const float *q;
    const uint16_t *k, *v;
    int group, hd, max_seq, splits;
    const int32_t *pos;
    float scale;
    float *o_part;
    float2 *ml_part;
    unsigned *done;
    float *out;
};

template <int VEC, int LP, int G>
static int launch_split(arc_context *ctx, const SplitArgs &a) {
    return arc_launch_pdl(ctx, "attention_split_kernel", attention_split_kernel<VEC, LP, G>, a.grid,
                          dim3(ATTN_THREADS), 0, a.q, a.k, a.v, a.group, a.hd, a.max_seq, a.splits, a.pos,
                          a.scale, a.o_part, a.ml_part, a.done, a.out);
}

template <int VEC, int LP>
static int launch_split_g(arc_context *ctx, int G, const SplitArgs &a) {
    switch (G) {
    case 4: return launch_split<VEC, LP, 4>(ctx, a);
    case 2: return launch_split<VEC, LP, 2>(ctx, a);
    default: return launch_split<VEC, LP, 1>(ctx, a);
    }
}

extern "C" int arc_op_attention(arc_context *ctx, const float *q, const uint16_t *k_cache,
                         const uint16_t *v_cache, int32_t n_heads, int32_t n_kv_heads,
                         int32_t head_dim, int32_t max_seq, const int32_t *pos, float *scratch,
                         float *out) {
    ARC_REQUIRE(ctx, "ctx is null");
    ARC_REQUIRE(q && k_cache && v_cache && pos && scratch && out,
                "null pointer (q, k_cache, v_cache, pos, scratch and out are required)");
    ARC_REQUIRE(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                "n_heads (%d) must be a positive multiple of n_kv_heads (%d)", n_heads, n_kv_heads);
    ARC_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && head_dim <= ATTN_MAX_HEAD_DIM,
                "head_dim must be even and in [2, %d], got %d", ATTN_MAX_HEAD_DIM, head_dim);
    ARC_REQUIRE(max_seq > 0 && max_seq <= ATTN_MAX_SEQ, "max_seq must be in [1, %d], got %d",
                ATTN_MAX_SEQ, max_seq);
    const bool wide = head_dim % 8 == 0;
    ARC_REQUIRE((uintptr_t)k_cache % (wide ? 16 : 4) == 0 && (uintptr_t)v_cache % (wide ? 16 : 4) == 0,
                "the caches must be %d-byte aligned", wide ? 16 : 4);
    ARC_REQUIRE((uintptr_t)scratch % 8 == 0, "scratch must be 8-byte aligned");
    const int group = n_heads / n_kv_heads;
    const int G = group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
    ARC_REQUIRE(n_heads / G <= ARC_ATTN_MAX_GROUPS, "at most %d head groups, got %d", ARC_ATTN_MAX_GROUPS,
                n_heads / G);
    const int splits = attention_splits(max_seq);
    SplitArgs a;
    a.grid = dim3(n_heads / G, splits);
    a.q = q;
    a.k = k_cache;
    a.v = v_cache;
    a.group = group;
    a.hd = head_dim;
    a.max_seq = max_seq;
    a.splits = splits;
    a.pos = pos;
    a.scale = (float)(1.0 / sqrt((double)head_dim));
    a.o_part = scratch;
    a.ml_part = reinterpret_cast<float2 *>(scratch + (size_t)n_heads * splits * head_dim);
    a.done = ctx->attn_done;
    a.out = out;
    if (!wide) return launch_split_g<2, 32>(ctx, G, a);
    if (head_dim <= 32) return launch_split_g<8, 4>(ctx, G, a);
    if (head_dim <= 64) return launch_split_g<8, 8>(ctx, G, a);
    return launch_split_g<8, 16>(ctx, G, a);
}

extern "C" int arc_op_attention_scratch_bytes(int32_t n_heads, int32_t head_dim, int32_t max_seq,
                                              uint64_t *bytes) {
    ARC_REQUIRE(bytes, "bytes is null");
    *bytes = 0;
    ARC_REQUIRE(n_heads > 0 && head_dim > 0 && max_seq > 0 && max_seq <= ATTN_MAX_SEQ,
                "shapes out of range: n_heads %d, head_dim %d, max_seq %d", n_heads, head_dim, max_seq);
    *bytes = arc_attention_scratch_bytes(n_heads, head_dim, max_seq);
    return ARC_OK;
}

