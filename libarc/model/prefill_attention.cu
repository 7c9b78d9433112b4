// prefill_attention.cu -- attention for a chunk of prompt tokens at once: RoPE and the KV-cache
// write for every position of the chunk, then causal attention of every query over the cache
// (earlier chunks and this one), flash-style on tensor cores.
//
// Two kernels. rope_kv rotates q and k of each chunk token at its position exactly as the decode
// attention does (same angles, same roundings), stores k and v to the cache in its form and q,
// rounded to bf16, to a scratch buffer. (A q8_0 cache's rows attended are then widened to bf16,
// kv_widen, and flash_prefill reads those.) flash_prefill then takes 64 queries of one head per block (16 per
// warp) and walks the keys in tiles of 64: S = Q K^T and O += P V by mma.sync (bf16 inputs, float32
// sums), with the softmax running online (the row maximum and sum rescaled as they grow), so no
// score matrix is ever stored. K and V tiles are double-buffered through cp.async.
//
// The keys are cut into segments of FLASH_SEG_KEYS at fixed positions. A query's attention is its
// segments' (each walked alone) merged in order (prefill_merge), so it does not depend on the chunk
// it is in, and a short chunk at a long context spreads its walk over more blocks: a launch whose
// keys reach past the first segment runs a block per segment into float32 partials, then
// combine_kernel; one that does not (every query in segment 0) writes its output at once, which
// is the same arithmetic with nothing to merge. A head's sink (gpt-oss: AttnSpec::sinks) enters
// there alone, in the factor the merged sums are normalized by (prefill_norm).
//
// Heads past ATTN_TILE_MAX_HEAD_DIM elements (Gemma 4's of 512) take rope_kv, then in place of
// flash_prefill attention_wide.cu's kernel: each query alone over the cache in float32 from its bf16
// q, no partials (prefill_attention_part_floats is 0 for them), out rounded to bf16 once.
#include <math.h>

#include "attention_tile.cuh"
#include "kv_cache.cuh"

enum { ROPE_THREADS = 128, FLASH_Q = ATTN_TILE, FLASH_KV = ATTN_TILE, FLASH_THREADS = ATTN_TILE_THREADS,
       FLASH_SEG_TILES = 16, FLASH_SEG_KEYS = FLASH_SEG_TILES * FLASH_KV };

// The partials of a segment for one (query, head): m (log2 units) and l, then hd sums.
__host__ __device__ inline size_t part_floats(int hd) { return (size_t)hd + 2; }

// The running merge of a query's segments, in order: (m, l, o) of the segments so far and (ms, ls,
// os) of the next, each a walk's maximum, sum and unnormalized output. A segment with no key of
// the query (ms = -inf) leaves them as they are; the first that has one is copied.
__device__ __forceinline__ void prefill_merge(float &m, float &l, float *o, float ms, float ls, const float *os,
                                              int count, int stride) {
    if (ms == -INFINITY) return;
    if (m == -INFINITY) {
        m = ms;
        l = ls;
        for (int d = 0; d < count; ++d) o[d * stride] = os[d * stride];
        return;
    }
    const float mn = fmaxf(m, ms), a = exp2f(m - mn), b = exp2f(ms - mn);
    l = __fmaf_rn(l, a, __fmul_rn(ls, b));
    for (int d = 0; d < count; ++d) o[d * stride] = __fmaf_rn(o[d * stride], a, __fmul_rn(os[d * stride], b));
    m = mn;
}

// q_out[i] (n_heads, hd) bf16, and cache rows start + i of kv, for chunk token i = blockIdx.x: q
// and k rotated at position start + i as `rope` says (kernels.cuh) from qkv[i] = [q (n_heads, hd)
// | k (n_kv_heads, hd) | v (n_kv_heads, hd)] float32, q rounded to nearest even, k and v stored
// in the cache's form (q8_0: hd % 32 == 0, a warp a block of 32). Launch: grid (n), ROPE_THREADS
// threads. Limits: hd even, <= ATTN_MAX_HEAD_DIM (the angles' arrays hold half of that).
__global__ void __launch_bounds__(ROPE_THREADS)
rope_kv_kernel(const float *__restrict__ qkv, const RopeArgs rope, const KvCache kv, int n_heads, int n_kv_heads,
               int hd, int max_seq, int start, uint16_t *__restrict__ q_out, int stride) {
    __shared__ float cos_t[ATTN_MAX_HEAD_DIM / 2], sin_t[ATTN_MAX_HEAD_DIM / 2];
    const int i = blockIdx.x, pos = start + i, half = rope.half, tid = threadIdx.x;
    pdl_launch_dependents();
    // The angles need only the weights: computed before the wait.
    for (int j = tid; j < half; j += ROPE_THREADS) rope_angles(rope, pos, j, &sin_t[j], &cos_t[j]);
    pdl_wait();
    __syncthreads();
    const float *row = qkv + (size_t)i * stride;
    for (int e = tid; e < n_heads * hd; e += ROPE_THREADS) {
        const int head = e / hd, d = e % hd;
        q_out[(size_t)i * n_heads * hd + e] = f32_to_bf16(rope_rotate_half(row + head * hd, d, half, cos_t, sin_t));
    }
    for (int e = tid; e < n_kv_heads * hd; e += ROPE_THREADS) {
        const int kvh = e / hd, d = e % hd;
        const float kx = rope_rotate_half(row + (n_heads + kvh) * hd, d, half, cos_t, sin_t);
        const float vx = row[(n_heads + n_kv_heads + kvh) * hd + d];
        if (kv.q8()) {
            q8_store_warp(kx, static_cast<int8_t *>(kv.k), kv.k_scale, kvh, pos, d, hd, max_seq);
            q8_store_warp(vx, static_cast<int8_t *>(kv.v), kv.v_scale, kvh, pos, d, hd, max_seq);
        } else {
            const size_t at = ((size_t)kvh * max_seq + pos) * hd + d;
            static_cast<uint16_t *>(kv.k)[at] = f32_to_bf16(kx);
            static_cast<uint16_t *>(kv.v)[at] = f32_to_bf16(vx);
        }
    }
}

// out (n, n_heads, hd) bf16 for the 64 queries of tile gridDim.y - 1 - blockIdx.y (the longest
// first) and head blockIdx.x: query i at position start + i attends to cache rows 0..start + i of
// kv head head / (n_heads / n_kv_heads). q (n, n_heads, hd) bf16, rotated; the caches
// (n_kv_heads, max_seq, hd) bf16, rows up to start + n - 1 written. scale_log2 = log2(e) times
// the scores' factor; with window > 0 the query at p attends rows p - window + 1..p only, and the
// tiles wholly before every query's window are not read. sinks: null, or each query head's sink
// logit (n_heads bf16 words), read where the block writes out (prefill_norm); a block writing
// partials leaves it to combine_kernel. Launch: grid (n_heads, ceil(n / 64)), FLASH_THREADS
// threads, 5 * 64 * D * 2 bytes of dynamic shared memory. Limits: hd even, hd <= D; q and the
// caches 16-byte aligned when hd % 8 == 0, else 4-byte.
template <int D>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_prefill_kernel(const uint16_t *__restrict__ q, const uint16_t *__restrict__ k_cache,
                     const uint16_t *__restrict__ v_cache, int n_heads, int n_kv_heads, int hd, int max_seq, int n,
                     int start, float scale_log2, int window, const uint16_t *__restrict__ sinks,
                     uint16_t *__restrict__ out, float *__restrict__ part) {
    constexpr int KD = D / 16;   // k16 steps of q . k
    constexpr int NT = FLASH_KV / 8;  // n8 key tiles of a score row
    extern __shared__ __align__(128) uint16_t smem[];
    uint16_t *qs = smem, *ks = smem + FLASH_Q * D, *vs = ks + 2 * FLASH_KV * D;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
    const int head = blockIdx.x, kvh = head / (n_heads / n_kv_heads);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * FLASH_Q;
    const int kv_end = start + min(q0 + FLASH_Q, n);  // keys [kv_begin, kv_end) reach some query here
    const int kv_begin = window > 0 && start + q0 >= window ? start + q0 - window + 1 : 0;
    // Key tiles [j0, tiles): this block's segment of them where it writes partials, else all (one
    // segment, the launch's keys all in the first).
    const int seg = blockIdx.z, seg0 = seg * FLASH_SEG_TILES;
    const int j0 = part ? max(kv_begin / FLASH_KV, seg0) : kv_begin / FLASH_KV;
    const int tiles = part ? min((kv_end + FLASH_KV - 1) / FLASH_KV, seg0 + FLASH_SEG_TILES)
                           : (kv_end + FLASH_KV - 1) / FLASH_KV;
    const size_t q_stride = (size_t)n_heads * hd;
    const uint16_t *k_src = k_cache + (size_t)kvh * max_seq * hd, *v_src = v_cache + (size_t)kvh * max_seq * hd;

    pdl_launch_dependents();
    pdl_wait();  // q and the cache rows of this chunk are the previous kernel's output
    const int qpos0 = start + q0 + warp * 16 + g;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    float o[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
    if (j0 < tiles) {
    load_rows<D>(qs, q + (size_t)q0 * q_stride + (size_t)head * hd, q_stride, n - q0, hd, tid);
    load_rows<D>(ks, k_src + (size_t)j0 * FLASH_KV * hd, hd, kv_end - j0 * FLASH_KV, hd, tid);
    load_rows<D>(vs, v_src + (size_t)j0 * FLASH_KV * hd, hd, kv_end - j0 * FLASH_KV, hd, tid);
    cp_async_commit();

    // Rows g and g + 8 of the warp's 16 queries are this thread's: their maximum (in log2 units)
    // and partial sum of exponentials (this thread's columns only, summed over the quad at the end).
    uint32_t qf[KD][4];

    for (int j = j0; j < tiles; ++j) {
        const int k0 = j * FLASH_KV, buf = (j - j0) & 1;  // the tile's buffer
        if (j + 1 < tiles) {
            const int nb = buf ^ 1, k1 = k0 + FLASH_KV;
            load_rows<D>(ks + nb * FLASH_KV * D, k_src + (size_t)k1 * hd, hd, kv_end - k1, hd, tid);
            load_rows<D>(vs + nb * FLASH_KV * D, v_src + (size_t)k1 * hd, hd, kv_end - k1, hd, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (j == j0) {
#pragma unroll
            for (int kd = 0; kd < KD; ++kd)
                ldmatrix_x4(smem_addr(qs + row_offset<D>(warp * 16 + lane % 16, kd * 2 + lane / 16)), qf[kd]);
        }
        const uint16_t *kt = ks + buf * FLASH_KV * D, *vt = vs + buf * FLASH_KV * D;

        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
        for (int kd = 0; kd < KD; ++kd) {
#pragma unroll
            for (int nb = 0; nb < NT / 2; ++nb) {
                uint32_t kf[4];
                ldmatrix_x4(smem_addr(kt + row_offset<D>(nb * 16 + (lane / 16) * 8 + lane % 8, kd * 2 + (lane / 8) % 2)),
                            kf);
                mma_bf16_16816(s[2 * nb], qf[kd], kf[0], kf[1]);
                mma_bf16_16816(s[2 * nb + 1], qf[kd], kf[2], kf[3]);
            }
        }

        // Scale to log2 units; mask keys past a row's position (only tiles reaching the diagonal) and,
        // windowed, keys at or before its position - window (only tiles reaching below a window).
        const bool masked = k0 + FLASH_KV - 1 > start + q0 || (window > 0 && k0 <= start + q0 + FLASH_Q - 1 - window);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = k0 + nt * 8 + 2 * t + (e & 1), qpos = qpos0 + (e >> 1) * 8;
                s[nt][e] = masked && (key > qpos || key >= kv_end || (window > 0 && key <= qpos - window))
                               ? -INFINITY : s[nt][e] * scale_log2;
            }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // Unwindowed, key 0 is in every row's first tile, so the maximum is finite from the first
            // tile on; windowed, a row's first tiles may hold none of its keys: while its maximum is
            // -inf the exponentials are taken against 0 (every one of them 0, the sums unchanged).
            const float m_new = fmaxf(m_run[r], mx);
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float alpha = exp2f(m_run[r] - m_use);
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                s[nt][2 * r] = exp2f(s[nt][2 * r] - m_use);
                s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - m_use);
                sum += s[nt][2 * r] + s[nt][2 * r + 1];
            }
            l_run[r] = l_run[r] * alpha + sum;
            m_run[r] = m_new;
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                o[dt][2 * r] *= alpha;
                o[dt][2 * r + 1] *= alpha;
            }
        }

        // O += P V: the score accumulators are already in the layout of an A fragment.
#pragma unroll
        for (int kk = 0; kk < FLASH_KV / 16; ++kk) {
            const uint32_t pf[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                                    pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                uint32_t vf[4];
                ldmatrix_x4_trans(smem_addr(vt + row_offset<D>(kk * 16 + ((lane / 8) % 2) * 8 + lane % 8, dp * 2 + lane / 16)),
                                  vf);
                mma_bf16_16816(o[2 * dp], pf, vf[0], vf[1]);
                mma_bf16_16816(o[2 * dp + 1], pf, vf[2], vf[3]);
            }
        }
        __syncthreads();  // every warp is done with this tile's buffers before they are refilled
    }
    }  // a segment with no key of this block's queries leaves m -inf, l and o 0

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l = l_run[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int qi = q0 + warp * 16 + g + r * 8;
        if (qi >= n) continue;
        if (part) {  // (m, l, o) of this segment; combine_kernel merges them
            float *p = part + ((size_t)seg * n + qi) * n_heads * part_floats(hd) + (size_t)head * part_floats(hd);
            if (t == 0) {
                p[0] = m_run[r];
                p[1] = l;
            }
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                const int d = dt * 8 + 2 * t;
                if (d < hd) {
                    p[2 + d] = o[dt][2 * r];
                    p[3 + d] = o[dt][2 * r + 1];
                }
            }
            continue;
        }
        // One segment: the merge of prefill_merge copies it, then normalizes as combine_kernel does.
        const float inv = prefill_norm(m_run[r], l, sinks, head);
        uint16_t *dst = out + (size_t)qi * q_stride + (size_t)head * hd;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            const int d = dt * 8 + 2 * t;
            if (d < hd)
                *reinterpret_cast<uint32_t *>(dst + d) = pack_bf16x2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
        }
    }
}

// out[i, head] (bf16) of query i = blockIdx.x and head blockIdx.y: its segments' partials
// (segs of them, n queries each) merged in order, then normalized (prefill_norm: divided by the
// sum, sinks null, or with the head's sink in the denominator). hd threads at most 256.
__global__ void __launch_bounds__(ATTN_TILE_MAX_HEAD_DIM)
combine_kernel(const float *__restrict__ part, int segs, int n, int n_heads, int hd,
               const uint16_t *__restrict__ sinks, uint16_t *__restrict__ out) {
    pdl_launch_dependents();
    pdl_wait();
    const int i = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
    const size_t seg_stride = (size_t)n * n_heads * part_floats(hd);
    const float *p = part + ((size_t)i * n_heads + head) * part_floats(hd);
    float m = -INFINITY, l = 0.0f, o = 0.0f;
    for (int s = 0; s < segs; ++s) {
        const float *ps = p + s * seg_stride;
        prefill_merge(m, l, &o, ps[0], ps[1], ps + 2 + d, d < hd ? 1 : 0, 1);
    }
    if (d < hd) out[((size_t)i * n_heads + head) * hd + d] = f32_to_bf16(o * prefill_norm(m, l, sinks, head));
}

uint64_t prefill_attention_part_floats(int32_t n_heads, int32_t head_dim, int32_t n, int32_t start) {
    if (start + n <= FLASH_SEG_KEYS || head_dim > ATTN_TILE_MAX_HEAD_DIM) return 0;  // wide heads: none
    const uint64_t segs = (uint64_t)(start + n + FLASH_SEG_KEYS - 1) / FLASH_SEG_KEYS;
    return segs * n * n_heads * part_floats(head_dim);
}

template <int D>
static int launch_flash(arc_context *ctx, const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                        int n_heads, int n_kv_heads, int hd, int max_seq, int n, int start, const AttnSpec &spec,
                        uint16_t *out, float *part, uint64_t part_n) {
    auto kernel = flash_prefill_kernel<D>;
    const int smem = 5 * 64 * D * 2;
    if (smem > 48 * 1024)  // a host-side attribute, legal while capturing
        ARC_CUDA(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const float scale_log2 = (float)(1.4426950408889634 * spec.scale);
    if (start + n <= FLASH_SEG_KEYS)  // every query's keys in the first segment: no merge
        return arc_launch_pdl(ctx, "flash_prefill_kernel", kernel, dim3(n_heads, (n + FLASH_Q - 1) / FLASH_Q),
                              dim3(FLASH_THREADS), (size_t)smem, q, k_cache, v_cache, n_heads, n_kv_heads, hd,
                              max_seq, n, start, scale_log2, spec.window, spec.sinks, out, (float *)nullptr);
    // Queries in pieces of whole tiles whose partials fit part (part_n floats); each piece's
    // segments reach as far as its last query's keys.
    const uint64_t per_query = prefill_attention_part_floats(n_heads, hd, 1, start + n - 1);
    const uint64_t fit = part ? part_n / per_query : 0;
    const int most = fit >= (uint64_t)n ? n : (int)(fit / FLASH_Q * FLASH_Q);
    ARC_REQUIRE_AS("prefill attention", most >= 1, "the attention's partials need %llu floats, have %llu",
                   (unsigned long long)(per_query * (n < FLASH_Q ? n : FLASH_Q)),
                   (unsigned long long)(part ? part_n : 0));
    for (int at = 0; at < n; at += most) {
        const int rows = n - at < most ? n - at : most;
        const int segs = (start + at + rows + FLASH_SEG_KEYS - 1) / FLASH_SEG_KEYS;
        ARC_TRY(arc_launch_pdl(ctx, "flash_prefill_kernel", kernel, dim3(n_heads, (rows + FLASH_Q - 1) / FLASH_Q, segs),
                               dim3(FLASH_THREADS), (size_t)smem, q + (size_t)at * n_heads * hd, k_cache, v_cache,
                               n_heads, n_kv_heads, hd, max_seq, rows, start + at, scale_log2, spec.window, spec.sinks,
                               out, part));
        ARC_TRY(arc_launch_pdl(ctx, "combine_kernel", combine_kernel, dim3(rows, n_heads), dim3(hd), 0,
                               (const float *)part, segs, rows, n_heads, hd, spec.sinks, out + (size_t)at * n_heads * hd));
    }
    return ARC_OK;
}

int prefill_attention_layer(arc_context *ctx, const float *qkv, const AttnSpec &spec, const KvCache &kv,
                            int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t max_seq, int32_t n,
                            int32_t start, uint16_t *q_scratch, uint16_t *out, float *part, uint64_t part_n,
                            int32_t qkv_stride) {
    const RopeArgs &rope = spec.rope;
    ARC_REQUIRE(ctx, "ctx is null");
    ARC_REQUIRE(qkv && rope.inv_freq && kv.k && kv.v && q_scratch && out,
                "null pointer (qkv, inv_freq, k_cache, v_cache, q_scratch and out are required)");
    ARC_REQUIRE(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                "n_heads (%d) must be a positive multiple of n_kv_heads (%d)", n_heads, n_kv_heads);
    ARC_REQUIRE(n_heads <= 65535, "at most 65535 heads, got %d", n_heads);
    ARC_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && head_dim <= ATTN_MAX_HEAD_DIM,
                "head_dim must be even and in [2, %d], got %d", ATTN_MAX_HEAD_DIM, head_dim);
    ARC_REQUIRE(head_dim <= ATTN_TILE_MAX_HEAD_DIM || (head_dim % 8 == 0 && !kv.q8()),
                "head_dim %d past %d takes a multiple of 8 and a bf16 cache, not q8_0", head_dim,
                ATTN_TILE_MAX_HEAD_DIM);
    ARC_REQUIRE(max_seq > 0 && max_seq <= ATTN_MAX_SEQ, "max_seq must be in [1, %d], got %d", ATTN_MAX_SEQ, max_seq);
    ARC_REQUIRE(n > 0 && start >= 0 && (int64_t)start + n <= max_seq,
                "the chunk (n %d from position %d) must be non-empty and end within max_seq %d", n, start, max_seq);
    const int align = head_dim % 8 == 0 ? 16 : 4;
    ARC_REQUIRE(!kv.q8() || (kv.v_scale && kv.wide && head_dim % KV_Q8_BLOCK == 0),
                "a q8_0 cache takes head_dim %% %d == 0, both scales and a widening buffer, got head_dim %d",
                KV_Q8_BLOCK, head_dim);
    // What flash_prefill reads: the bf16 cache, or a q8_0 cache's rows widened.
    uint16_t *k_cache = kv.q8() ? kv.wide : static_cast<uint16_t *>(kv.k);
    uint16_t *v_cache = kv.q8() ? kv.wide + (size_t)n_kv_heads * max_seq * head_dim : static_cast<uint16_t *>(kv.v);
    ARC_REQUIRE((uintptr_t)k_cache % align == 0 && (uintptr_t)v_cache % align == 0 && (uintptr_t)q_scratch % align == 0,
                "the caches and q_scratch must be %d-byte aligned", align);
    ARC_REQUIRE((uintptr_t)out % 4 == 0, "out must be 4-byte aligned");
    ARC_REQUIRE(rope.half >= 1 && 2 * rope.half <= head_dim, "RoPE of %d pairs in a head of %d", rope.half, head_dim);
    ARC_REQUIRE(spec.window >= 0 && spec.scale > 0.0 && isfinite(spec.scale), "window %d, scale %g", spec.window,
                spec.scale);
    // A shared layer's rows hold q alone, and it stores no k or v (rope_kv's kv heads: none)
    const int32_t stored = spec.cached ? 0 : n_kv_heads;
    const int32_t stride = qkv_stride ? qkv_stride : (n_heads + 2 * stored) * head_dim;
    ARC_REQUIRE(stride >= (n_heads + 2 * stored) * head_dim, "qkv rows of %d floats hold no q, k and v", stride);
    ARC_TRY(arc_launch_pdl(ctx, "rope_kv_kernel", rope_kv_kernel, dim3(n), dim3(ROPE_THREADS), 0, qkv, rope, kv,
                           n_heads, stored, head_dim, max_seq, start, q_scratch, (int)stride));
    if (head_dim > ATTN_TILE_MAX_HEAD_DIM)  // attention_wide.cu: each query alone over the cache
        return wide_prefill_attention(ctx, q_scratch, spec, k_cache, v_cache, n_heads, n_kv_heads, head_dim, max_seq,
                                      n, start, out);
    if (kv.q8()) {  // the tiles some query of the chunk reads (from the window's first, for a windowed layer)
        const int lo = spec.window > 0 && start >= spec.window ? start - spec.window + 1 : 0;
        ARC_TRY(kv_widen(ctx, kv, n_kv_heads, head_dim, max_seq, lo / FLASH_KV * FLASH_KV, start + n));
    }
    if (head_dim <= 32)
        return launch_flash<32>(ctx, q_scratch, k_cache, v_cache, n_heads, n_kv_heads, head_dim, max_seq, n, start, spec,
                                out, part, part_n);
    if (head_dim <= 64)
        return launch_flash<64>(ctx, q_scratch, k_cache, v_cache, n_heads, n_kv_heads, head_dim, max_seq, n, start, spec,
                                out, part, part_n);
    if (head_dim <= 128)
        return launch_flash<128>(ctx, q_scratch, k_cache, v_cache, n_heads, n_kv_heads, head_dim, max_seq, n, start,
                                 spec, out, part, part_n);
    // head_dim <= ATTN_TILE_MAX_HEAD_DIM here
    return launch_flash<256>(ctx, q_scratch, k_cache, v_cache, n_heads, n_kv_heads, head_dim, max_seq, n, start, spec,
                             out, part, part_n);
}

extern "C" int arc_op_prefill_attention_scratch_bytes(int32_t n_heads, int32_t head_dim, int32_t n, int32_t start,
                                                      uint64_t *bytes) {
    ARC_REQUIRE(bytes, "bytes is null");
    ARC_REQUIRE(n_heads > 0 && head_dim > 0 && n > 0 && start >= 0, "n_heads %d, head_dim %d, n %d, start %d",
                n_heads, head_dim, n, start);
    *bytes = prefill_attention_part_floats(n_heads, head_dim, n, start) * sizeof(float);
    return ARC_OK;
}

// arc_op_prefill_attention and arc_op_prefill_attention_sinks (sinks null: none), reported as `who`.
static int op_prefill_attention(const char *who, arc_context *ctx, const float *qkv, const float *inv_freq,
                                uint16_t *k_cache, uint16_t *v_cache, int32_t n_heads, int32_t n_kv_heads,
                                int32_t head_dim, int32_t max_seq, int32_t n, int32_t start, const uint16_t *sinks,
                                uint16_t *q_scratch, float *scratch, uint16_t *out) {
    const AttnSpec spec{RopeArgs{inv_freq, head_dim / 2, 1.0f}, 1.0 / sqrt((double)head_dim), 0, sinks};
    const uint64_t need = n > 0 && start >= 0 && n_heads > 0 && head_dim > 0
                              ? prefill_attention_part_floats(n_heads, head_dim, n, start) : 0;
    ARC_REQUIRE_AS(who, scratch || need == 0, "scratch is null (arc_op_prefill_attention_scratch_bytes: %llu bytes)",
                   (unsigned long long)(need * sizeof(float)));
    return prefill_attention_layer(ctx, qkv, spec, KvCache{k_cache, v_cache}, n_heads, n_kv_heads, head_dim, max_seq, n, start,
                                   q_scratch, out, scratch, need);
}

extern "C" int arc_op_prefill_attention(arc_context *ctx, const float *qkv, const float *inv_freq, uint16_t *k_cache,
                                        uint16_t *v_cache, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                        int32_t max_seq, int32_t n, int32_t start, uint16_t *q_scratch,
                                        float *scratch, uint16_t *out) {
    return op_prefill_attention(__func__, ctx, qkv, inv_freq, k_cache, v_cache, n_heads, n_kv_heads, head_dim, max_seq,
                                n, start, nullptr, q_scratch, scratch, out);
}

extern "C" int arc_op_prefill_attention_sinks(arc_context *ctx, const float *qkv, const float *inv_freq,
                                              uint16_t *k_cache, uint16_t *v_cache, int32_t n_heads,
                                              int32_t n_kv_heads, int32_t head_dim, int32_t max_seq, int32_t n,
                                              int32_t start, const uint16_t *sinks, uint16_t *q_scratch,
                                              float *scratch, uint16_t *out) {
    return op_prefill_attention(__func__, ctx, qkv, inv_freq, k_cache, v_cache, n_heads, n_kv_heads, head_dim, max_seq,
                                n, start, sinks, q_scratch, scratch, out);
}
