// attention_wide.cu -- attention for heads wider than the tensor-core kernels take
// (ATTN_TILE_MAX_HEAD_DIM < hd <= ATTN_MAX_HEAD_DIM, hd % 8 == 0: Gemma 4's full-attention layers),
// over a bf16 cache, in float32 on the SIMT cores. One kernel serves the decode's row and the
// verify's rows (wide_decode_attention: attention.cu's attention_layer launches it after the rows'
// k and v are cached) and the prefill's queries (wide_prefill_attention: prefill_attention.cu
// launches it after rope_kv).
//
// A block of WIDE_THREADS threads takes up to DEC_HEADS query heads of one kv head (as the
// tensor-core decode kernel groups them) and walks its positions in steps of WIDE_STEP, the steps'
// k and v rows staged in shared memory by cp.async, the next step loading while the block works on
// the current one. Each warp owns HW of the block's heads, of one query row, and keeps their whole
// state (nothing is merged between warps):
// - scores: lane l takes key l % 16 of the step and half of the row's chunks of 8 elements (the
//   first half for l < 16), the dot with each of the warp's heads in float32 (q in shared memory as
//   float32, each chunk read by every lane of a half at once; the k rows WIDE_KPAD elements longer
//   than hd, so that the rows 8 lanes read lie on distinct banks), the halves then added by a shuffle
//   (both halves get the same sum);
// - the softmax online per head in log2 units, each lane keeping the sum of its key's weights,
//   the 16 keys' sums added at the end;
// - o += p v: lane l owns elements 8 l..8 l + 7 and 256 + 8 l..256 + 8 l + 7 (those below hd), each
//   key's weight broadcast by a shuffle, the step's keys in order.
// The order of every sum depends only on the positions and the shapes, never on timing: the
// decode and the verify, which launch the same kernel with the same grid, get the same bits at a
// position, and a prefill query's output does not depend on the chunk it is in (the steps its block
// walks past its own keys leave its sums exactly as they were).
#include <math.h>

#include "attention_merge.cuh"
#include "decode_layout.cuh"

// What the kernel takes (both forms; each reads its own fields).
struct WideArgs {
    const float *qkv;   // the decode's and the verify's: rows (q | k | v) float32, unrotated, `stride` apart
    const uint16_t *q;  // the prefill's: (n, n_heads, hd) bf16, rotated
    RopeArgs rope;
    const uint16_t *k, *v;  // the bf16 cache, (n_kv_heads, max_seq, hd)
    int n_heads, n_kv_heads, hd, max_seq;
    float scale_log2;  // the scores' factor times log2(e)
    int window;
    const uint16_t *sinks;  // null: none
    const int32_t *pos;     // the decode's and the verify's: each row's position
    int stride, splits;
    float *o_part;
    float2 *ml_part;
    unsigned *done;
    float *out;
    int n, start;     // the prefill's
    uint16_t *out_bf;
};

enum { WIDE_THREADS = ATTN_TILE_THREADS, WIDE_WARPS = WIDE_THREADS / 32, WIDE_STEP = 16, WIDE_KPAD = 8 };
static_assert(ATTN_TILE % WIDE_STEP == 0, "a tile of 64 positions holds whole steps");
static_assert(ATTN_MAX_HEAD_DIM <= 2 * 256 && ATTN_TILE_MAX_HEAD_DIM >= 256,
              "a lane owns two runs of 8 elements of a head, the first always inside it");
// The merge's weights (DEC_HEADS heads of DEC_MAX_SPLITS parts) go over the steps' rows.
static_assert((size_t)2 * WIDE_STEP * (2 * (ATTN_TILE_MAX_HEAD_DIM + 8) + WIDE_KPAD) * 2 >=
                  (size_t)DEC_HEADS * DEC_MAX_SPLITS * 4,
              "the merge's weights fit the steps' buffers");

// Dynamic shared memory: two steps of k rows (hd + WIDE_KPAD elements each) and v rows (hd), bf16;
// the q of each warp's HW heads, float32; and for the decode the rotation's cosines and sines.
__host__ __device__ inline size_t wide_smem_bytes(int hd, int hw, bool prefill) {
    return (size_t)2 * WIDE_STEP * (2 * hd + WIDE_KPAD) * 2 + (size_t)WIDE_WARPS * hw * hd * 4 +
           (prefill ? 0 : (size_t)hd * 4);
}

// The registers a thread of the kernel may take: HW heads' 16 output elements a lane and their
// state, and room for the rest; without a cap ptxas keeps fewer and spills a few.
constexpr int wide_max_registers(int hw) { return hw == 1 ? 112 : hw == 2 ? 144 : 192; }

// The first position a query at p attends (AttnSpec::window).
__device__ __forceinline__ int wide_first(int p, int window) { return window > 0 && p >= window ? p - window + 1 : 0; }

// Eight bf16 elements (16 bytes) widened to float32.
__device__ __forceinline__ void widen8(const uint4 w, float (&x)[8]) {
    x[0] = bf16_lo(w.x), x[1] = bf16_hi(w.x), x[2] = bf16_lo(w.y), x[3] = bf16_hi(w.y);
    x[4] = bf16_lo(w.z), x[5] = bf16_hi(w.z), x[6] = bf16_lo(w.w), x[7] = bf16_hi(w.w);
}

// Block x = kvh * ht + g of the decode (y: its split, z: its row), block (x, y = kvh * ht + g) of
// the prefill, takes the query heads h0..h0 + nh - 1 of kv head kvh, h0 = kvh * group + 16 g,
// ht = ceil(group / 16). Scores s = (q . k) * scale_log2 (log2 units), positions > p - window
// only when window > 0, none past p.
// Decode (PREFILL false): row z at p = pos[z] (a position outside [0, max_seq) writes NaN to its
// out), q rotated at p in float32 from qkv's row (RopeArgs, rope_rotate_half; not rounded); its
// cache rows lo..p written already (the new row included). Of the nc tiles of 64 positions
// holding lo..p, block y of S = gridDim.y takes per = ceil(nc / S) in a row, and ceil(nc / per)
// blocks hold some. Warp w takes heads h0 + w HW.. of the row. A block holding every tile writes
// out[head] = o / l at once; else o_part[head][y][hd] = sum 2^(s - m) v and ml_part[head][y] =
// (m, l) (row stride splits), and the last of the kv head's blocks to finish (a ticket on done[x],
// reset after) merges them (merge_parts; VEC: float4 loads, o_part 16-byte aligned, the same sums).
// Prefill (PREFILL true): q (n, n_heads, hd) bf16, rotated; query i at position start + i. A block
// takes R = 4 / wpr consecutive queries, wpr = ceil(min(group, 16) / HW) warps each (the longest
// first), walks every position from the first query's first to the last query's, and writes out
// (n, n_heads, hd) bf16, rounded to nearest even; nothing else.
// sinks (AttnSpec: null, or n_heads bf16 logits) join the denominator where the output is written:
// the decode's as the tensor-core kernel's, the merge's as merge_parts', the prefill's as
// prefill_norm.
// Launch: WIDE_THREADS threads, wide_smem_bytes(hd, HW, PREFILL) bytes of dynamic shared memory.
// Limits: 256 < hd <= 512, hd % 8 == 0, the caches 16-byte aligned; HW * 4 >= min(group, 16).
template <int HW, bool PREFILL, bool VEC>
__global__ void __launch_bounds__(WIDE_THREADS) __maxnreg__(wide_max_registers(HW))
wide_attention_kernel(const WideArgs a) {
    extern __shared__ __align__(16) uint16_t wide_smem[];
    const int hd = a.hd, ldk = hd + WIDE_KPAD, nch = hd / 8;
    uint16_t *ks = wide_smem, *vs = ks + 2 * WIDE_STEP * ldk;  // [stage][WIDE_STEP][ldk], [stage][WIDE_STEP][hd]
    float *qs = reinterpret_cast<float *>(vs + 2 * WIDE_STEP * hd);  // [warp][HW][hd]
    float *cos_t = qs + WIDE_WARPS * HW * hd, *sin_t = cos_t + hd / 2;  // the decode's
    __shared__ bool is_last;  // the decode's: this block merges

    pdl_launch_dependents();
    pdl_wait();  // q, and the cache rows up to the positions attended, are the earlier kernels' output
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int group = a.n_heads / a.n_kv_heads, ht = (group + DEC_HEADS - 1) / DEC_HEADS;
    const int x = PREFILL ? blockIdx.y : blockIdx.x, kvh = x / ht, h0 = kvh * group + (x % ht) * DEC_HEADS;
    const int nh = min(DEC_HEADS, (kvh + 1) * group - h0);
    // The warps a query takes, and the queries a block takes.
    const int wpr = PREFILL ? (min(group, (int)DEC_HEADS) + HW - 1) / HW : WIDE_WARPS, nq = WIDE_WARPS / wpr;

    // The block's positions first..last; its warps' query rows and heads.
    int first, last, split = 0, parts = 1, i0 = 0, nrows = 1;
    int p_row = 0;  // the decode's position
    if constexpr (PREFILL) {
        i0 = (gridDim.x - 1 - blockIdx.x) * nq;
        nrows = min(nq, a.n - i0);
        first = wide_first(a.start + i0, a.window);
        last = a.start + i0 + nrows - 1;
    } else {
        const int row = blockIdx.z;
        p_row = a.pos[row];
        float *out = a.out + (size_t)row * a.n_heads * hd;
        if (p_row < 0 || p_row >= a.max_seq) {
            if (blockIdx.y == 0)
                for (int e = tid; e < nh * hd; e += WIDE_THREADS) out[(size_t)h0 * hd + e] = quiet_nan();
            return;
        }
        const int lo = wide_first(p_row, a.window), S = gridDim.y;
        const int ns = p_row / ATTN_TILE + 1, c_lo = lo / ATTN_TILE, nc = ns - c_lo;
        const int per = (nc + S - 1) / S;
        parts = (nc + per - 1) / per;
        split = blockIdx.y;
        if (split >= parts) return;
        const int j0 = c_lo + split * per, j1 = min(j0 + per, ns);
        first = max(lo, j0 * ATTN_TILE);
        last = min(p_row, j1 * ATTN_TILE - 1);
    }
    // Warp w's query (qi of the block's, PREFILL) and its heads h0 + hw0..h0 + hw0 + nhw - 1.
    const int qi = PREFILL ? warp / wpr : 0, hw0 = (PREFILL ? warp % wpr : warp) * HW;
    const int nhw = qi < nrows ? max(0, min(HW, nh - hw0)) : 0;
    const int w_pos = PREFILL ? a.start + i0 + min(qi, nrows - 1) : p_row;  // the warp's query's position
    const int w_first = PREFILL ? wide_first(w_pos, a.window) : first, w_last = PREFILL ? w_pos : last;

    // Step st's k and v rows, those outside first..last zero-filled (never read from the cache).
    const size_t head_base = (size_t)kvh * a.max_seq * hd;
    const uint16_t *k_src = a.k + head_base, *v_src = a.v + head_base;
    auto load_step = [&](int st, int stage) {
        const uint32_t kb = smem_addr(ks + stage * WIDE_STEP * ldk), vb = smem_addr(vs + stage * WIDE_STEP * hd);
        for (int e = tid; e < WIDE_STEP * nch; e += WIDE_THREADS) {
            const int r = e / nch, c = e - r * nch, t = st * WIDE_STEP + r;
            const bool ok = t >= first && t <= last;
            const size_t at = ok ? (size_t)t * hd + c * 8 : 0;
            cp_async16(kb + (r * ldk + c * 8) * 2, k_src + at, ok);
            cp_async16(vb + (r * hd + c * 8) * 2, v_src + at, ok);
        }
        cp_async_commit();
    };
    const int st0 = first / WIDE_STEP, st1 = last / WIDE_STEP;
    load_step(st0, 0);

    // q of every warp's heads, float32.
    if constexpr (!PREFILL) {
        for (int j = tid; j < a.rope.half; j += WIDE_THREADS) rope_angles(a.rope, p_row, j, &sin_t[j], &cos_t[j]);
        __syncthreads();
    }
    for (int e = tid; e < WIDE_WARPS * HW * hd; e += WIDE_THREADS) {
        const int w = e / (HW * hd), hw = (e / hd) % HW, d = e % hd;
        const int wq = PREFILL ? w / wpr : 0, head_at = (PREFILL ? w % wpr : w) * HW + hw;
        float qx = 0.0f;
        if (wq < nrows && head_at < nh) {
            const int head = h0 + head_at;
            if constexpr (PREFILL) qx = bf16_to_f32(a.q[((size_t)(i0 + wq) * a.n_heads + head) * hd + d]);
            else
                qx = rope_rotate_half(a.qkv + (size_t)blockIdx.z * a.stride + (size_t)head * hd, d, a.rope.half,
                                      cos_t, sin_t);
        }
        qs[e] = qx;
    }

    float m_run[HW], l_run[HW], o[HW][2][8];
#pragma unroll
    for (int hw = 0; hw < HW; ++hw) {
        m_run[hw] = -INFINITY, l_run[hw] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[hw][0][e] = 0.0f, o[hw][1][e] = 0.0f;
    }
    const int key = lane % 16, half_chunks = (nch + 1) / 2;
    const int c0 = lane < 16 ? 0 : half_chunks, c1 = lane < 16 ? half_chunks : nch;
    const bool two = 256 + 8 * lane < hd;  // the lane's second run lies inside the head
    const float *qw = qs + (size_t)warp * HW * hd;

    for (int st = st0; st <= st1; ++st) {
        const int stage = (st - st0) & 1;
        if (st < st1) load_step(st + 1, stage ^ 1);
        else cp_async_commit();  // an empty group keeps the count of the wait below
        cp_async_wait<1>();
        __syncthreads();
        if (nhw > 0) {
            // The scores of key `key` of the step, this lane's half of the chunks, then both halves.
            const uint16_t *kr = ks + (stage * WIDE_STEP + key) * ldk;
            float s[HW];
#pragma unroll
            for (int hw = 0; hw < HW; ++hw) s[hw] = 0.0f;
#pragma unroll 2
            for (int c = c0; c < c1; ++c) {
                float kx[8];
                widen8(*reinterpret_cast<const uint4 *>(kr + c * 8), kx);
#pragma unroll
                for (int hw = 0; hw < HW; ++hw) {
                    const float4 qa = *reinterpret_cast<const float4 *>(qw + hw * hd + c * 8);
                    const float4 qb = *reinterpret_cast<const float4 *>(qw + hw * hd + c * 8 + 4);
                    s[hw] = fmaf(qa.x, kx[0], s[hw]), s[hw] = fmaf(qa.y, kx[1], s[hw]);
                    s[hw] = fmaf(qa.z, kx[2], s[hw]), s[hw] = fmaf(qa.w, kx[3], s[hw]);
                    s[hw] = fmaf(qb.x, kx[4], s[hw]), s[hw] = fmaf(qb.y, kx[5], s[hw]);
                    s[hw] = fmaf(qb.z, kx[6], s[hw]), s[hw] = fmaf(qb.w, kx[7], s[hw]);
                }
            }
            const int t = st * WIDE_STEP + key;
            const bool in = t >= w_first && t <= w_last;
            float pr[HW];
#pragma unroll
            for (int hw = 0; hw < HW; ++hw) {
                const float both = s[hw] + __shfl_xor_sync(0xffffffffu, s[hw], 16);
                const float sx = in ? both * a.scale_log2 : -INFINITY;
                float mx = sx;
#pragma unroll
                for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                // A head with no position seen yet (maximum -inf) takes its exponentials against 0.
                const float m_new = fmaxf(m_run[hw], mx), m_use = m_new == -INFINITY ? 0.0f : m_new;
                const float alpha = exp2f(m_run[hw] - m_use);
                pr[hw] = exp2f(sx - m_use);
                l_run[hw] = fmaf(l_run[hw], alpha, pr[hw]);
                m_run[hw] = m_new;
                if (alpha != 1.0f) {
#pragma unroll
                    for (int e = 0; e < 8; ++e) o[hw][0][e] *= alpha, o[hw][1][e] *= alpha;
                }
            }
            // o += p v over the step's keys in order.
            const uint16_t *vr = vs + stage * WIDE_STEP * hd + 8 * lane;
#pragma unroll 2
            for (int r = 0; r < WIDE_STEP; ++r) {
                float v0[8], v1[8];
                widen8(*reinterpret_cast<const uint4 *>(vr + r * hd), v0);
                widen8(two ? *reinterpret_cast<const uint4 *>(vr + r * hd + 256) : make_uint4(0u, 0u, 0u, 0u), v1);
#pragma unroll
                for (int hw = 0; hw < HW; ++hw) {
                    const float w = __shfl_sync(0xffffffffu, pr[hw], r);
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        o[hw][0][e] = fmaf(w, v0[e], o[hw][0][e]);
                        o[hw][1][e] = fmaf(w, v1[e], o[hw][1][e]);
                    }
                }
            }
        }
        __syncthreads();  // every warp is done with this step's buffers before they are refilled
    }
    cp_async_wait<0>();

    // Each head's sum of exponentials over the step's 16 keys (both halves hold them).
#pragma unroll
    for (int hw = 0; hw < HW; ++hw)
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) l_run[hw] += __shfl_xor_sync(0xffffffffu, l_run[hw], off);

    if constexpr (PREFILL) {
        const int i = i0 + qi;
#pragma unroll
        for (int hw = 0; hw < HW; ++hw) {
            if (hw >= nhw) continue;
            const int head = h0 + hw0 + hw;
            const float f = prefill_norm(m_run[hw], l_run[hw], a.sinks, head);
            uint16_t *dst = a.out_bf + ((size_t)i * a.n_heads + head) * hd + 8 * lane;
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                *reinterpret_cast<uint32_t *>(dst + e) = pack_bf16x2(o[hw][0][e] * f, o[hw][0][e + 1] * f);
                if (two)
                    *reinterpret_cast<uint32_t *>(dst + 256 + e) = pack_bf16x2(o[hw][1][e] * f, o[hw][1][e + 1] * f);
            }
        }
        return;
    } else {
        const int row = blockIdx.z;
        float *out = a.out + (size_t)row * a.n_heads * hd;
        float *o_part = a.o_part + (size_t)row * a.n_heads * a.splits * hd;
        float2 *ml_part = a.ml_part + (size_t)row * a.n_heads * a.splits;
#pragma unroll
        for (int hw = 0; hw < HW; ++hw) {
            if (hw >= nhw) continue;
            const int head = h0 + hw0 + hw;
            if (parts == 1) {
                // Every position here: out = o / l, or with a sink sl the sums against top = max(m, sl)
                // and the sink's term in l, as the tensor-core kernel writes them.
                const bool sink = a.sinks != nullptr;
                const float sl = sink ? sink_log2(a.sinks, head) : 0.0f, top = sink ? fmaxf(m_run[hw], sl) : m_run[hw];
                const float wgt = exp2f(m_run[hw] - top);
                float l = wgt * l_run[hw];
                if (sink) l += exp2f(sl - top);
                float *dst = out + (size_t)head * hd + 8 * lane;
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    dst[e] = wgt * o[hw][0][e] / l;
                    if (two) dst[256 + e] = wgt * o[hw][1][e] / l;
                }
            } else {
                float *dst = o_part + ((size_t)head * a.splits + split) * hd + 8 * lane;
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    dst[e] = o[hw][0][e];
                    if (two) dst[256 + e] = o[hw][1][e];
                }
                if (lane == 0) ml_part[(size_t)head * a.splits + split] = make_float2(m_run[hw], l_run[hw]);
            }
        }
        if (parts == 1) return;
        // Every thread's partials are visible device-wide before the block takes its ticket.
        __threadfence();
        __syncthreads();
        unsigned *done = a.done + (size_t)row * a.n_heads;
        if (tid == 0) is_last = atomicAdd(&done[blockIdx.x], 1u) == (unsigned)(parts - 1);
        __syncthreads();
        if (!is_last) return;
        __threadfence();
        // The last block merges the parts (attention_merge.cuh), its weights over the steps' buffers.
        float *fw = reinterpret_cast<float *>(wide_smem);
        merge_parts<VEC, WIDE_WARPS, DEC_MAX_SPLITS, DEC_MERGE_BATCH>(nh, h0, hd, a.splits, parts, ml_part, o_part,
                                                                     a.sinks, fw, out);
        if (tid == 0) done[blockIdx.x] = 0;
    }
}

// The kernel for HW heads a warp, its shared memory allowed up to what the widest heads take.
template <int HW, bool PREFILL, bool VEC>
static int launch_wide(arc_context *ctx, const char *name, const WideArgs &a, dim3 grid) {
    auto kernel = wide_attention_kernel<HW, PREFILL, VEC>;
    const size_t most = wide_smem_bytes(ATTN_MAX_HEAD_DIM, HW, PREFILL);
    ARC_CUDA(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most));
    return arc_launch_pdl(ctx, name, kernel, grid, dim3(WIDE_THREADS), wide_smem_bytes(a.hd, HW, PREFILL), a);
}

// The decode's row stored first (the verify's rows are), then a grid (n_kv_heads * ht, S, rows)
// over the positions as attention.cu's tensor-core kernel divides them, into its partials.
int wide_decode_attention(arc_context *ctx, const float *qkv, const AttnSpec &spec, const KvCache &kv, int n_heads,
                          int n_kv_heads, int hd, int max_seq, const int32_t *pos, float *scratch, float *out,
                          const AttnRows &rows) {
    ARC_REQUIRE(hd > ATTN_TILE_MAX_HEAD_DIM && hd <= ATTN_MAX_HEAD_DIM && hd % 8 == 0 && !kv.q8(),
                "head_dim %d: the wide kernel takes a multiple of 8 in (%d, %d] and a bf16 cache", hd,
                ATTN_TILE_MAX_HEAD_DIM, ATTN_MAX_HEAD_DIM);
    if (rows.count == 1 && !spec.cached)
        ARC_TRY(launch_kv_store(ctx, qkv, 1, 0, pos, spec.rope, kv, n_heads, n_kv_heads, hd, max_seq));
    const int splits = tiles_splits(max_seq), group = n_heads / n_kv_heads, ht = (group + DEC_HEADS - 1) / DEC_HEADS;
    const size_t part = (size_t)rows.count * n_heads * splits * hd;  // the partials of every row
    WideArgs a{};
    a.qkv = qkv, a.rope = spec.rope;
    a.k = static_cast<const uint16_t *>(kv.k), a.v = static_cast<const uint16_t *>(kv.v);
    a.n_heads = n_heads, a.n_kv_heads = n_kv_heads, a.hd = hd, a.max_seq = max_seq;
    a.scale_log2 = (float)(1.4426950408889634 * spec.scale), a.window = spec.window, a.sinks = spec.sinks;
    a.pos = pos, a.stride = rows.stride, a.splits = splits, a.o_part = scratch;
    a.ml_part = reinterpret_cast<float2 *>(scratch + part), a.done = rows.count > 1 ? rows.done : ctx->attn_done;
    a.out = out;
    const int most = group < DEC_HEADS ? group : DEC_HEADS;  // a block's heads, at most
    const dim3 grid(n_kv_heads * ht, tiles_blocks(n_kv_heads * ht, splits), rows.count);
    const bool vec = (uintptr_t)a.o_part % 16 == 0;
    const char *name = rows.count > 1 ? "wide_attention_kernel<rows>" : "wide_attention_kernel";
    if (most <= WIDE_WARPS)
        return vec ? launch_wide<1, false, true>(ctx, name, a, grid) : launch_wide<1, false, false>(ctx, name, a, grid);
    if (most <= 2 * WIDE_WARPS)
        return vec ? launch_wide<2, false, true>(ctx, name, a, grid) : launch_wide<2, false, false>(ctx, name, a, grid);
    return vec ? launch_wide<4, false, true>(ctx, name, a, grid) : launch_wide<4, false, false>(ctx, name, a, grid);
}

// A grid (ceil(n / R), n_kv_heads * ht), R queries a block.
int wide_prefill_attention(arc_context *ctx, const uint16_t *q, const AttnSpec &spec, const uint16_t *k_cache,
                           const uint16_t *v_cache, int n_heads, int n_kv_heads, int hd, int max_seq, int n, int start,
                           uint16_t *out) {
    ARC_REQUIRE(hd > ATTN_TILE_MAX_HEAD_DIM && hd <= ATTN_MAX_HEAD_DIM && hd % 8 == 0,
                "head_dim %d: the wide kernel takes a multiple of 8 in (%d, %d]", hd, ATTN_TILE_MAX_HEAD_DIM,
                ATTN_MAX_HEAD_DIM);
    const int group = n_heads / n_kv_heads, ht = (group + DEC_HEADS - 1) / DEC_HEADS;
    const int most = group < DEC_HEADS ? group : DEC_HEADS;
    // HW heads a warp, wpr warps a query, R = WIDE_WARPS / wpr queries a block.
    const int hw = most <= 1 ? 1 : most <= 2 ? 2 : 4, wpr = (most + hw - 1) / hw, nq = WIDE_WARPS / wpr;
    WideArgs a{};
    a.q = q, a.rope = spec.rope, a.k = k_cache, a.v = v_cache, a.n_heads = n_heads, a.n_kv_heads = n_kv_heads;
    a.hd = hd, a.max_seq = max_seq, a.scale_log2 = (float)(1.4426950408889634 * spec.scale), a.window = spec.window;
    a.sinks = spec.sinks, a.n = n, a.start = start, a.out_bf = out;
    const dim3 grid((n + nq - 1) / nq, n_kv_heads * ht);
    const char *name = "wide_attention_kernel<prefill>";
    if (hw == 1) return launch_wide<1, true, false>(ctx, name, a, grid);
    if (hw == 2) return launch_wide<2, true, false>(ctx, name, a, grid);
    return launch_wide<4, true, false>(ctx, name, a, grid);
}
