// attention.cu -- one token's attention at batch 1, with the rotary embedding and the KV-cache
// write of the new position fused in: q and the new k are rotated (rotate-half RoPE) as they are
// read from the QKV GEMV's output, the new k and v are stored to the bf16 cache, and the scores
// run over the cached positions and the new one.
//
// Split across blocks (flash-decoding): a block takes one query head and one chunk of positions
// (more than one, in turn, where the grid would otherwise exceed ATTN_GRID_BLOCKS) and writes a
// partial result (its max, its sum of exponentials, its unnormalized output); the last block of a
// head to finish combines the head's partials, so one kernel does all of it. When one block holds
// every chunk up to the position, it writes the output directly.
//
// At batch 1 the kernel is latency-bound, so it is laid out around its chain of memory round
// trips: the cached rows of earlier positions were written by earlier steps, so a block loads its
// whole chunk of k and v before the dependency wait, while the GEMV before it still runs; after
// the wait only q and the new position's row are read.
#include <math.h>

#include "attention.cuh"

// Attention of query head blockIdx.x over its chunks of CHUNK positions c = blockIdx.y,
// blockIdx.y + gridDim.y, ... whose positions are <= *pos, the position being decoded (one chunk a
// block unless the position is long: attention_blocks).
// qkv = [q (n_heads, hd) | k (n_kv_heads, hd) | v (n_kv_heads, hd)] float32, unrotated, as the
// QKV GEMV writes it; head h reads kv head h / group. k_cache, v_cache (n_kv_heads, max_seq, hd)
// bf16, this layer's; the rows before *pos are read, row *pos is written (rotated k and v, rounded
// to nearest even) by the first query head of each kv head, and the scores use those rounded
// values, as the reference does. RoPE as `rope` says (kernels.cuh: RopeArgs, rope_rotate_half).
// A block writes o_part[head][blockIdx.y][hd] = sum_t exp(s_t - m) v_t and ml_part[head][blockIdx.y]
// = (m, sum_t exp(s_t - m)) over its chunks' positions t, s_t = (q . k_t) * scale, m their max;
// with window > 0 only positions t > *pos - window count (the chunks wholly before are skipped);
// the last of the head's blocks holding chunks to finish (a ticket on done[head], which it
// resets) writes out[head][:] = the partials merged in block order (row stride `splits`, at
// least gridDim.y). When one block holds every chunk it writes out at once.
// A position outside [0, max_seq) writes NaN to out and nothing to the cache.
// MULTI: blocks may hold more than one chunk (gridDim.y < ceil(max_seq / CHUNK)); without it the
// chunk loop below runs once and compiles to the straight line it is.
// Launch: grid (n_heads, attention_blocks(n_heads, ceil(max_seq / CHUNK))), ATTN_THREADS threads.
// Limits: hd even and <= L::HD, the variant's (VEC == 8 needs hd % 8 == 0); attn_variant picks it.
// PLAIN: the layer rotates every element at factor 1 and attends every position (Llama's): the
// window's bounds and the partial rotation compile away, which a step of small kernels feels
// (docs/PERF.md, 2026-12-02).
// ROWS: the verify's row blockIdx.z at pos_ptr[row], with its own qkv row (qkv_stride apart), out,
// partials and tickets; its k and v are cached already (verify_attention.cu): nothing is read
// before the wait nor stored. Each row computes the one-row launch's bits at its position.
template <int VEC, int LP, bool MULTI, bool PLAIN, bool ROWS>
__global__ void __launch_bounds__(ATTN_THREADS, 1)
attention_kernel(const float *__restrict__ qkv, const RopeArgs rope, uint16_t *k_cache,
                 uint16_t *v_cache, int n_heads, int n_kv_heads, int hd, int max_seq, int splits,
                 const int32_t *__restrict__ pos_ptr, float scale, int window, float *__restrict__ o_part,
                 float2 *__restrict__ ml_part, unsigned *done, float *__restrict__ out, int qkv_stride) {
    using L = AttnLayout<VEC, LP>;
    constexpr int E = L::E, CHUNK = L::CHUNK;
    // Sized by the variant's longest row, not ATTN_MAX_HEAD_DIM: the small heads' variants keep
    // the small static footprint the kernels around them have.
    __shared__ float red[ATTN_WARPS][L::HD];
    __shared__ float qs[L::HD], ks[L::HD], vs[L::HD];
    __shared__ float cos_t[L::HD / 2], sin_t[L::HD / 2];
    __shared__ float wstat[2][ATTN_WARPS], wsum[ATTN_WARPS];  // per warp: the scores' max, the weights' sum
    __shared__ bool last;

    pdl_launch_dependents();
    const int head = blockIdx.x, group = n_heads / n_kv_heads, kvh = head / group;
    const int split = blockIdx.y, stride = gridDim.y;  // this block's chunks: split, split + stride, ...
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int sub = lane % LP, pw = lane / LP;
    const int nvh = hd / VEC, half = PLAIN ? hd / 2 : rope.half;

    // Before the wait: the position (written before this step began), the rotation's angles, and
    // the cached rows of earlier positions of the block's first chunk; nothing that the kernels of
    // this step write.
    const int row = ROWS ? blockIdx.z : 0;
    if constexpr (ROWS) {
        qkv += (size_t)row * qkv_stride;
        out += (size_t)row * n_heads * hd;
        o_part += (size_t)row * n_heads * splits * hd;
        ml_part += (size_t)row * n_heads * splits;
        done += row * n_heads;
        pdl_wait();
    }
    const int pos = pos_ptr[row];
    if (pos < 0 || pos >= max_seq) {
        pdl_wait();
        if (split == 0)
            for (int d = tid; d < hd; d += ATTN_THREADS) out[(size_t)head * hd + d] = quiet_nan();
        return;
    }
    // The positions attended: lo..pos (lo > 0 only in a windowed layer), in chunks c_lo..ns - 1.
    const int lo = !PLAIN && window > 0 && pos >= window ? pos - window + 1 : 0;
    const int ns = pos / CHUNK + 1, c_lo = PLAIN ? 0 : lo / CHUNK, nc = ns - c_lo;
    if (split >= nc) return;
    const bool holds_new = (nc - 1) % stride == split;  // the block whose last chunk holds pos
    for (int i = tid; i < half; i += ATTN_THREADS) rope_angles<PLAIN>(rope, pos, i, &sin_t[i], &cos_t[i]);
    const size_t head_base = (size_t)kvh * max_seq * hd;
    float kf[ATTN_UNROLL][E], vf[ATTN_UNROLL][E];
    {
        const int start = (c_lo + split) * CHUNK, n = min(CHUNK, pos + 1 - start);
        load_chunk<VEC, LP>(k_cache + head_base + (size_t)start * hd, hd, nvh, min(n, pos - start), warp, pw, sub, kf);
        load_chunk<VEC, LP>(v_cache + head_base + (size_t)start * hd, hd, nvh, min(n, pos - start), warp, pw, sub, vf);
    }

    // After it: this head's q, and where the block holds the new position, its k and v.
    pdl_wait();
    const float *q_row = qkv + (size_t)head * hd;
    const float *k_row = qkv + (size_t)(n_heads + kvh) * hd;
    const float *v_row = qkv + (size_t)(n_heads + n_kv_heads + kvh) * hd;
    for (int d = tid; d < hd; d += ATTN_THREADS) {
        qs[d] = q_row[d];
        if (holds_new) {
            ks[d] = k_row[d];
            vs[d] = v_row[d];
        }
    }
    __syncthreads();
    float qf[E];
#pragma unroll
    for (int i = 0; i < L::NV; ++i) {
        const int j = sub + LP * i;
#pragma unroll
        for (int e = 0; e < VEC; ++e) qf[i * VEC + e] = j < nvh ? rope_rotate_half<PLAIN>(qs, j * VEC + e, half, cos_t, sin_t) : 0.0f;
    }
    if (!ROWS && holds_new && head % group == 0) {
        // The first query head of the kv head stores the new row for later steps.
        const size_t at = head_base + (size_t)pos * hd;
        for (int d = tid; d < hd; d += ATTN_THREADS) {
            k_cache[at + d] = f32_to_bf16(rope_rotate_half<PLAIN>(ks, d, half, cos_t, sin_t));
            v_cache[at + d] = f32_to_bf16(vs[d]);
        }
    }

    // The block's chunks in turn, as an online softmax: m is the largest score so far (the same in
    // every thread), and each lane's sums of weights and weighted v are rescaled when it grows.
    // Only long positions give a block more than one chunk (see attention_blocks); the chunks
    // after its first are loaded after the wait.
    float m = -INFINITY, l = 0.0f, acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    for (int c = c_lo + split, it = 0;; c += stride, ++it) {
        const int start = c * CHUNK;
        const int n = min(CHUNK, pos + 1 - start);  // positions of this chunk, the new one included
        const int tp = pos - start;                 // the new position's row, when < CHUNK
        const int t_lo = lo - start;                // rows before it are outside the window
        if (MULTI && it > 0) {
            load_chunk<VEC, LP>(k_cache + head_base + (size_t)start * hd, hd, nvh, min(n, tp), warp, pw, sub, kf);
            load_chunk<VEC, LP>(v_cache + head_base + (size_t)start * hd, hd, nvh, min(n, tp), warp, pw, sub, vf);
        }
        if (tp < CHUNK) {
            // The lanes of the new row take it as the cache holds it.
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u) {
                if (warp * L::PPW + L::PG * u + pw != tp) continue;
#pragma unroll
                for (int i = 0; i < L::NV; ++i) {
                    const int j = sub + LP * i;
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        if (j < nvh) {
                            kf[u][i * VEC + e] = as_cached(rope_rotate_half<PLAIN>(ks, j * VEC + e, half, cos_t, sin_t));
                            vf[u][i * VEC + e] = as_cached(vs[j * VEC + e]);
                        }
                    }
                }
            }
        }

        // Scores of the chunk's rows, kept in registers: after the sum over its LP lanes every
        // lane of a row holds the row's score; rows past the chunk's end score -inf.
        float s[ATTN_UNROLL];
        float mc = m;
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            const int t = warp * L::PPW + L::PG * u + pw;
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < E; ++e) d = fmaf(qf[e], kf[u][e], d);
#pragma unroll
            for (int off = LP / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
            s[u] = t < n && (PLAIN || t >= t_lo) ? d * scale : -INFINITY;
            mc = fmaxf(mc, s[u]);
        }
        // The maximum so far: over the warp's rows (lanes of other rows are LP apart), then over
        // the warps (wstat alternates between chunks, so a chunk's writes never meet the reads
        // of the one before).
#pragma unroll
        for (int off = LP; off < 32; off <<= 1) mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, off));
        const int buf = MULTI ? it & 1 : 0;
        if (lane == 0) wstat[buf][warp] = mc;
        __syncthreads();
        mc = wstat[buf][0];
#pragma unroll
        for (int w = 1; w < ATTN_WARPS; ++w) mc = fmaxf(mc, wstat[buf][w]);
        if (MULTI && it > 0) {
            const float r = expf(m - mc);
            l *= r;
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] *= r;
        }
        m = mc;

        // Weights and the weighted sum of v, each lane its rows.
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            const float p = expf(s[u] - m);  // 0 past the chunk's end
            l += p;
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] = fmaf(p, vf[u][e], acc[e]);
        }
        if (!MULTI || c + stride >= ns) break;
    }

    // The lanes and warps holding the same elements summed; the sum of the weights likewise, once
    // per row.
#pragma unroll
    for (int off = LP; off < 32; off <<= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
#pragma unroll
    for (int e = 0; e < E; ++e)
#pragma unroll
        for (int off = LP; off < 32; off <<= 1) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], off);
    if (pw == 0) {
#pragma unroll
        for (int i = 0; i < L::NV; ++i) {
            const int j = sub + LP * i;
            if (j < nvh) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) red[warp][j * VEC + e] = acc[i * VEC + e];
            }
        }
    }
    if (lane == 0) wsum[warp] = l;
    __syncthreads();
    float2 stat = make_float2(m, wsum[0]);
#pragma unroll
    for (int w = 1; w < ATTN_WARPS; ++w) stat.y += wsum[w];
    const int parts = min(nc, stride);  // the head's blocks holding chunks
    if (parts == 1) {
        for (int d = tid; d < hd; d += ATTN_THREADS) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; ++w) o += red[w][d];
            out[(size_t)head * hd + d] = o / stat.y;
        }
        return;
    }
    for (int d = tid; d < hd; d += ATTN_THREADS) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; ++w) o += red[w][d];
        o_part[((size_t)head * splits + split) * hd + d] = o;
    }
    if (tid == 0) ml_part[(size_t)head * splits + split] = stat;

    // Every thread's partials are visible device-wide before the block takes its ticket.
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&done[head], 1u) == (unsigned)(parts - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Merge the blocks' partials in order, rescaling the running sums whenever the maximum grows;
    // ATTN_MERGE partials are loaded together (one round trip, not one per partial).
    const float2 *ml = ml_part + (size_t)head * splits;
    for (int d = tid; d < hd; d += ATTN_THREADS) {
        const float *op = o_part + (size_t)head * splits * hd + d;
        float mm = -INFINITY, ll = 0.0f, o = 0.0f;
        for (int c0 = 0; c0 < parts; c0 += ATTN_MERGE) {
            float2 st[ATTN_MERGE];
            float oc[ATTN_MERGE];
#pragma unroll
            for (int k = 0; k < ATTN_MERGE; ++k) {
                if (c0 + k < parts) {
                    st[k] = __ldcg(&ml[c0 + k]);
                    oc[k] = __ldcg(op + (size_t)(c0 + k) * hd);
                }
            }
#pragma unroll
            for (int k = 0; k < ATTN_MERGE; ++k) {
                if (c0 + k < parts) {
                    const float mn = fmaxf(mm, st[k].x);
                    const float r = expf(mm - mn), w = expf(st[k].x - mn);
                    ll = fmaf(ll, r, w * st[k].y);
                    o = fmaf(o, r, w * oc[k]);
                    mm = mn;
                }
            }
        }
        out[(size_t)head * hd + d] = o / ll;
    }
    if (tid == 0) done[head] = 0;
}

// The layout of a head size: 16-byte rows where head_dim % 8 == 0 (lanes per row by width),
// 4-byte ones otherwise (head_dim <= 128 then). Chunk sizes follow: 256, 128, 64, 32 and 32 positions.
struct AttnVariant {
    int vec, lp;
};

static AttnVariant attn_variant(int32_t hd) {
    if (hd % 8 != 0) return {2, 32};
    if (hd <= 32) return {8, 4};
    if (hd <= 64) return {8, 8};
    if (hd <= 128) return {8, 16};
    return {8, 32};
}

static int attn_chunk(int32_t hd) { return ATTN_THREADS / attn_variant(hd).lp * ATTN_UNROLL; }

static int attention_splits(int32_t hd, int32_t max_seq) {
    const int chunk = attn_chunk(hd);
    return (max_seq + chunk - 1) / chunk;
}

// The blocks a head's `splits` chunks spread over: a block a chunk, up to ATTN_GRID_BLOCKS
// blocks in all; past that a block takes every (blocks)-th chunk, the ones after its first
// loaded after the dependency wait. A block past the position returns at once, but every block
// of the grid is dispatched: measured on the H200 (docs/PERF.md), 4,096 blocks (32 heads over
// 8,192 positions) cost attention 2.4 µs more than 1,024 at the same position.
static int attention_blocks(int32_t n_heads, int splits) {
    const int per_head = ATTN_GRID_BLOCKS / n_heads > 0 ? ATTN_GRID_BLOCKS / n_heads : 1;
    return splits < per_head ? splits : per_head;
}

uint64_t arc_attention_scratch_bytes(int32_t n_heads, int32_t head_dim, int32_t max_seq) {
    if (n_heads <= 0 || head_dim <= 0 || max_seq <= 0) return 0;
    const uint64_t parts = (uint64_t)n_heads * attention_splits(head_dim, max_seq);
    return parts * head_dim * sizeof(float) + parts * sizeof(float2);
}

// What every variant is launched with.
struct AttnArgs {
    const float *qkv;
    RopeArgs rope;
    uint16_t *k, *v;
    int n_heads, n_kv_heads, hd, max_seq, splits;
    const int32_t *pos;
    float scale;
    int window;
    float *o_part;
    float2 *ml_part;
    unsigned *done;
    float *out;
    AttnRows rows;  // the decode's one row, or the verify's
};

template <int VEC, int LP, bool ROWS>
static int launch_attention(arc_context *ctx, const AttnArgs &a) {
    const int blocks = attention_blocks(a.n_heads, a.splits);
    const dim3 grid(a.n_heads, blocks, a.rows.count);
    const bool plain = a.window == 0 && 2 * a.rope.half == a.hd && a.rope.factor == 1.0f;
    auto kernel = blocks < a.splits ? (plain ? attention_kernel<VEC, LP, true, true, ROWS> : attention_kernel<VEC, LP, true, false, ROWS>)
                                    : (plain ? attention_kernel<VEC, LP, false, true, ROWS> : attention_kernel<VEC, LP, false, false, ROWS>);
    return arc_launch_pdl(ctx, ROWS ? "attention_kernel<rows>" : "attention_kernel", kernel, grid, dim3(ATTN_THREADS), 0, a.qkv,
                          a.rope, a.k, a.v, a.n_heads, a.n_kv_heads, a.hd, a.max_seq, a.splits, a.pos, a.scale, a.window,
                          a.o_part, a.ml_part, a.done, a.out, a.rows.stride);
}

int attention_layer(arc_context *ctx, const float *qkv, const AttnSpec &spec, uint16_t *k_cache, uint16_t *v_cache,
                    int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t max_seq, const int32_t *pos,
                    float *scratch, float *out, const AttnRows &rows) {
    ARC_REQUIRE(ctx, "ctx is null");
    ARC_REQUIRE(rows.count == 1 || (rows.count > 1 && rows.stride > 0 && rows.done), "rows %d", rows.count);
    const RopeArgs &rope = spec.rope;
    ARC_REQUIRE(qkv && rope.inv_freq && k_cache && v_cache && pos && scratch && out,
                "null pointer (qkv, inv_freq, k_cache, v_cache, pos, scratch and out are required)");
    ARC_REQUIRE(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                "n_heads (%d) must be a positive multiple of n_kv_heads (%d)", n_heads, n_kv_heads);
    ARC_REQUIRE(n_heads <= ARC_ATTN_MAX_GROUPS, "at most %d heads, got %d", ARC_ATTN_MAX_GROUPS, n_heads);
    ARC_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && head_dim <= ATTN_MAX_HEAD_DIM && (head_dim <= 128 || head_dim % 8 == 0),
                "head_dim must be even and in [2, %d] (a multiple of 8 past 128), got %d", ATTN_MAX_HEAD_DIM, head_dim);
    ARC_REQUIRE(max_seq > 0 && max_seq <= ATTN_MAX_SEQ, "max_seq must be in [1, %d], got %d",
                ATTN_MAX_SEQ, max_seq);
    const AttnVariant variant = attn_variant(head_dim);
    ARC_REQUIRE((uintptr_t)k_cache % (variant.vec * 2) == 0 && (uintptr_t)v_cache % (variant.vec * 2) == 0,
                "the caches must be %d-byte aligned", variant.vec * 2);
    ARC_REQUIRE((uintptr_t)scratch % 8 == 0, "scratch must be 8-byte aligned");
    ARC_REQUIRE(rope.half >= 1 && 2 * rope.half <= head_dim, "RoPE of %d pairs in a head of %d", rope.half, head_dim);
    ARC_REQUIRE(spec.window >= 0 && spec.scale > 0.0 && isfinite(spec.scale), "window %d, scale %g", spec.window,
                spec.scale);
    const int splits = attention_splits(head_dim, max_seq);
    const size_t part = (size_t)rows.count * n_heads * splits * head_dim;  // the partials of every row
    const AttnArgs a{qkv, rope, k_cache, v_cache, n_heads, n_kv_heads, head_dim, max_seq, splits, pos,
                     (float)spec.scale, spec.window, scratch, reinterpret_cast<float2 *>(scratch + part),
                     rows.count > 1 ? rows.done : ctx->attn_done, out, rows};
    const bool r = rows.count > 1;
    if (variant.vec == 2) return r ? launch_attention<2, 32, true>(ctx, a) : launch_attention<2, 32, false>(ctx, a);
    if (variant.lp == 4) return r ? launch_attention<8, 4, true>(ctx, a) : launch_attention<8, 4, false>(ctx, a);
    if (variant.lp == 8) return r ? launch_attention<8, 8, true>(ctx, a) : launch_attention<8, 8, false>(ctx, a);
    if (variant.lp == 16) return r ? launch_attention<8, 16, true>(ctx, a) : launch_attention<8, 16, false>(ctx, a);
    return r ? launch_attention<8, 32, true>(ctx, a) : launch_attention<8, 32, false>(ctx, a);
}

extern "C" int arc_op_attention(arc_context *ctx, const float *qkv, const float *inv_freq, uint16_t *k_cache,
                                uint16_t *v_cache, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                int32_t max_seq, const int32_t *pos, float *scratch, float *out) {
    const AttnSpec spec{RopeArgs{inv_freq, head_dim / 2, 1.0f}, 1.0 / sqrt((double)head_dim), 0};
    return attention_layer(ctx, qkv, spec, k_cache, v_cache, n_heads, n_kv_heads, head_dim, max_seq, pos, scratch,
                           out);
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
