// attention.cu -- one token's attention at batch 1 (the decode's, and the verify's rows, each as
// the one-row launch computes it), with the rotary embedding and the KV-cache write of the new
// position fused in: attention_layer, which the forwards launch (attention_entry.cu: arc_ops.h's
// entry points).
//
// Laid out so that each cached k and v element is read once a token, at the bandwidth of the cache:
// - a block takes the query heads of one kv head (up to 16 of them: the rows of a tensor-core
//   product), so grouped-query attention reads a kv head's rows once, not once per query head;
// - the grid is fixed (a step graph is captured once), and its blocks divide the positions attended
//   on the device: at position p each of a kv head's `S` blocks takes its share of the
//   ceil((p + 1) / 64) tiles of 64 positions (fewer blocks work at short positions);
// - the tiles stream through shared memory by cp.async, the next one loading while the block
//   multiplies the current one: S = Q K^T and O += P V by mma.sync (attention_products.cuh), each
//   warp 16 of a tile's positions, the softmax online; a q8_0 cache's tiles of codes (three stages,
//   two loading) are read by the same ldmatrix and widened to bf16 in registers, its scales applied
//   to the products' sums (kv_cache.cuh);
// - the last block of a kv head to finish (a ticket) merges the blocks' partials, a warp a head and
//   DEC_MERGE_BATCH partials of a lane's four elements in flight at once: no second launch.
// q and the softmax weights enter the products as two bf16 parts each (hi + lo, split_bf16x2), so
// the scores and the weighted sums carry about 16 bits of q and p, meant to hold the float32
// reference's tolerance of the one-row kernel (2e-5 + 1e-4 |x|). The order of every sum depends
// only on the position and the shapes, so a verify row would compute the one-row bits at its
// position.
// Heads wider than ATTN_TILE_MAX_HEAD_DIM (Gemma 4's of 512) take attention_wide.cu's kernel
// instead, over the same grid, split arithmetic and partials, the decode's row stored to the cache
// first by the verify's store kernel (verify_attention.cu).
#include <math.h>

#include "attention_merge.cuh"
#include "attention_products.cuh"
#include "decode_layout.cuh"

// Attention of the query heads h0..h0 + nh - 1 of kv head kvh (block x = kvh * ht + i takes
// h0 = kvh * group + 16 i, ht = ceil(group / 16)) over its share of the positions lo..*pos:
// of the nc tiles of 64 positions holding them, block y of S = gridDim.y takes per = ceil(nc / S)
// in a row, and ceil(nc / per) blocks hold some.
// qkv = [q (n_heads, hd) | k (n_kv_heads, hd) | v (n_kv_heads, hd)] float32, unrotated, as the
// QKV GEMV writes it. k_cache, v_cache (n_kv_heads, max_seq, hd) bf16, this layer's; the rows
// before *pos are read, row *pos is written (rotated k and v, rounded to nearest even) by the
// block of the kv head's first heads holding it, and the scores use those rounded values, as the
// reference does. RoPE as `rope` says (kernels.cuh: RopeArgs, rope_rotate_half). scale_log2 is the
// scores' factor times log2(e); with window > 0 only positions > *pos - window count.
// A block writes o_part[head][y][hd] = sum_t 2^(s_t - m) v_t and ml_part[head][y] = (m, sum_t
// 2^(s_t - m)) (row stride `splits` >= S), s_t the scores in log2 units, m their max; the last of
// the kv head's blocks to finish (a ticket on done[x], which it resets) writes out[head][:] = the
// partials merged (VEC: four floats a load, hd % 4 == 0 and o_part 16-byte aligned; the same
// sums either way). When one block holds every tile it writes out at once. sinks (AttnSpec: null or
// n_heads bf16 logits) join there alone, the sums then against max(m, sl), sl a sink in log2 units.
// A position outside [0, max_seq) writes NaN to out and nothing to the cache.
// PLAIN: the layer rotates every element at factor 1 and attends every position (Llama's): the
// window's bounds and the partial rotation compile away.
// ROWS: the verify's row blockIdx.z at pos_ptr[row], with its own qkv row (qkv_stride apart), out,
// partials and tickets; its k and v are cached already (verify_attention.cu): nothing is read
// before the wait nor stored.
// Q8: the cache is q8_0 (KvCache; k_cache and v_cache hold codes, k_scale and v_scale the scales):
// DEC_Q8_STAGES tiles of codes in flight, each fragment of codes widened to bf16 in registers and
// multiplied as the bf16 tiles' are (q's elements and o's in the order that asks:
// attention_products.cuh), each key's scale applied to the sum of each block of 32 products (q .
// k), each value's to the weight it is multiplied by (p v, 32 output elements at a time); the new
// row enters quantized, as the cache will hold it. hd % 32 == 0, VEC.
// Launch: grid (n_kv_heads * ht, S, rows), ATTN_TILE_THREADS threads, dec_smem_bytes(D, Q8) bytes of
// dynamic shared memory. Limits: hd even, hd <= D; the caches 16-byte aligned when hd % 8 == 0.
template <int D, bool PLAIN, bool ROWS, bool VEC, bool Q8>
__global__ void __launch_bounds__(ATTN_TILE_THREADS)
decode_attention_kernel(const float *__restrict__ qkv, const RopeArgs rope, void *k_cache, void *v_cache,
                        uint16_t *k_scale, uint16_t *v_scale, int n_heads, int n_kv_heads, int hd, int max_seq, int splits, const int32_t *__restrict__ pos_ptr,
                        float scale_log2, int window, float *__restrict__ o_part, float2 *__restrict__ ml_part,
                        unsigned *done, float *__restrict__ out, int qkv_stride, const uint16_t *__restrict__ sinks) {
    constexpr int KD = D / 16;       // k16 steps of q . k
    constexpr bool QREG = D <= 128;  // q's fragments held in registers across the tiles
    constexpr int SB = D / KV_Q8_BLOCK;  // a row's scales, at most
    constexpr int NST = Q8 ? DEC_Q8_STAGES : 2;  // the tiles' stages
    extern __shared__ __align__(128) uint16_t smem[];
    uint16_t *kv = smem;  // [stage][k | v][64][D] bf16
    int8_t *codes = reinterpret_cast<int8_t *>(smem);  // Q8: [stage][k | v][64][D] codes
    uint16_t *q_hi = smem + dec_tile_bytes(D, Q8) / 2, *q_lo = q_hi + DEC_HEADS * D;
    float *cos_t = reinterpret_cast<float *>(q_lo + DEC_HEADS * D), *sin_t = cos_t + D / 2;
    uint16_t *scales = reinterpret_cast<uint16_t *>(sin_t + D / 2);  // Q8: [stage][k | v][64][hd / 32]
    // Q8: the current tile's scales as floats, [k | v][64][hd / 32], each converted once a tile
    float *fscales = reinterpret_cast<float *>(scales + (size_t)NST * 2 * ATTN_TILE * SB);
    uint16_t *const k_bf = static_cast<uint16_t *>(k_cache), *const v_bf = static_cast<uint16_t *>(v_cache);
    int8_t *const k_q8 = static_cast<int8_t *>(k_cache), *const v_q8 = static_cast<int8_t *>(v_cache);
    __shared__ float wm[DEC_WARPS][DEC_HEADS], wl[DEC_WARPS][DEC_HEADS], wa[DEC_HEADS][DEC_WARPS], wsum[DEC_HEADS];
    __shared__ bool last;

    pdl_launch_dependents();
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
    const int group = n_heads / n_kv_heads, ht = (group + DEC_HEADS - 1) / DEC_HEADS;
    const int kvh = blockIdx.x / ht, h0 = kvh * group + (blockIdx.x % ht) * DEC_HEADS;
    const int nh = min(DEC_HEADS, (kvh + 1) * group - h0);
    const int split = blockIdx.y, S = gridDim.y;

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
            for (int e = tid; e < nh * hd; e += ATTN_TILE_THREADS) out[(size_t)h0 * hd + e] = quiet_nan();
        return;
    }
    // The positions attended, lo..pos, lie in tiles c_lo..ns - 1; this block's are j0..j1 - 1.
    const int lo = !PLAIN && window > 0 && pos >= window ? pos - window + 1 : 0;
    const int ns = pos / ATTN_TILE + 1, c_lo = lo / ATTN_TILE, nc = ns - c_lo;
    const int per = (nc + S - 1) / S, parts = (nc + per - 1) / per;
    if (split >= parts) return;
    const int j0 = c_lo + split * per, j1 = min(j0 + per, ns);
    // The rows a tile takes from the cache: those before the new position (the decode substitutes
    // it from qkv), or up to it (the verify's rows are cached already).
    const int limit = ROWS ? pos + 1 : pos;
    const size_t head_base = (size_t)kvh * max_seq * hd;
    const int nb = hd / KV_Q8_BLOCK;  // Q8: a row's scales
    const size_t scale_base = (size_t)kvh * kv_seq_pad(max_seq) * nb;
    auto load_tile = [&](int j, int stage) {
        const size_t at = head_base + (size_t)j * ATTN_TILE * hd;
        if constexpr (Q8) {
            int8_t *ct = codes + (size_t)stage * 2 * ATTN_TILE * D;
            uint16_t *st = scales + (size_t)stage * 2 * ATTN_TILE * SB;
            const size_t sat = scale_base + (size_t)j * ATTN_TILE * nb;
            load_code_rows<D>(ct, k_q8 + at, limit - j * ATTN_TILE, hd, tid);
            load_code_rows<D>(ct + ATTN_TILE * D, v_q8 + at, limit - j * ATTN_TILE, hd, tid);
            load_scale_rows(st, k_scale + sat, hd, tid);
            load_scale_rows(st + ATTN_TILE * SB, v_scale + sat, hd, tid);
        } else {
            uint16_t *kt = kv + (size_t)stage * 2 * ATTN_TILE * D;
            load_rows<D>(kt, k_bf + at, hd, limit - j * ATTN_TILE, hd, tid);
            load_rows<D>(kt + ATTN_TILE * D, v_bf + at, hd, limit - j * ATTN_TILE, hd, tid);
        }
        cp_async_commit();
    };

    // The first NST - 1 tiles, each its own group (an empty one past j1).
    auto load_first = [&]() {
#pragma unroll
        for (int i = 0; i < NST - 1; ++i) {
            if (j0 + i < j1) load_tile(j0 + i, i);
            else cp_async_commit();
        }
    };
    // Before the wait (the decode): the angles and the first tiles, which earlier steps wrote.
    const int half = PLAIN ? hd / 2 : rope.half;
    for (int i = tid; i < half; i += ATTN_TILE_THREADS) rope_angles<PLAIN>(rope, pos, i, &sin_t[i], &cos_t[i]);
    if (!ROWS) load_first();
    pdl_wait();
    if (ROWS) load_first();
    __syncthreads();  // the angles
    // q of the block's heads, rotated, as hi and lo bf16 tiles (heads past nh and elements past
    // hd are zeros; Q8: each 16 elements in q8_k_slot's order); unrolled, so that the reads of qkv
    // are in flight together.
    static_assert(DEC_HEADS * D / 2 % ATTN_TILE_THREADS == 0, "q's pairs divide among the threads");
#pragma unroll
    for (int i = 0; i < DEC_HEADS * D / 2 / ATTN_TILE_THREADS; ++i) {
        const int e = tid + i * ATTN_TILE_THREADS, r = e / (D / 2), d = (e % (D / 2)) * 2;
        float a = 0.0f, b = 0.0f;
        if (r < nh && d < hd) {
            const float *q_row = qkv + (size_t)(h0 + r) * hd;
            a = rope_rotate_half<PLAIN>(q_row, d, half, cos_t, sin_t);
            b = rope_rotate_half<PLAIN>(q_row, d + 1, half, cos_t, sin_t);
        }
        uint32_t hi, lo2;
        split_bf16x2(a, b, hi, lo2);
        if constexpr (Q8) {
            const int c0 = (d & ~15) | q8_k_slot(d & 15), c1 = (d & ~15) | q8_k_slot((d + 1) & 15);
            const int o0 = row_offset<D>(r, c0 / 8) + c0 % 8, o1 = row_offset<D>(r, c1 / 8) + c1 % 8;
            q_hi[o0] = (uint16_t)hi, q_hi[o1] = (uint16_t)(hi >> 16);
            q_lo[o0] = (uint16_t)lo2, q_lo[o1] = (uint16_t)(lo2 >> 16);
        } else {
            const int off = row_offset<D>(r, d / 8) + d % 8;
            *reinterpret_cast<uint32_t *>(q_hi + off) = hi;
            *reinterpret_cast<uint32_t *>(q_lo + off) = lo2;
        }
    }
    __syncthreads();
    uint32_t qh[QREG ? KD : 1][4], ql[QREG ? KD : 1][4];
    if constexpr (QREG) {
#pragma unroll
        for (int kd = 0; kd < KD; ++kd) {
            ldmatrix_x4(smem_addr(q_hi + row_offset<D>(lane % 16, kd * 2 + lane / 16)), qh[kd]);
            ldmatrix_x4(smem_addr(q_lo + row_offset<D>(lane % 16, kd * 2 + lane / 16)), ql[kd]);
        }
    }

    // Rows g and g + 8 of the 16 heads are this thread's: their running maximum (log2 units) and
    // sum of exponentials (this thread's columns; summed over the quad at the end).
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    float o[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;

    for (int j = j0; j < j1; ++j) {
        const int buf = (j - j0) % NST, jn = j + NST - 1;
        if (jn < j1) load_tile(jn, (jn - j0) % NST);
        else cp_async_commit();  // an empty group keeps the count of the wait below
        cp_async_wait<NST - 1>();
        __syncthreads();
        uint16_t *kt = kv + (size_t)buf * 2 * ATTN_TILE * D, *vt = kt + ATTN_TILE * D;  // bf16's
        int8_t *kc = codes + (size_t)buf * 2 * ATTN_TILE * D, *vc = kc + ATTN_TILE * D;  // Q8's
        float *fk = fscales, *fv = fscales + ATTN_TILE * SB;
        if constexpr (Q8) {  // the tile's scales widened once here, not by every thread that uses one
            const uint16_t *sk = scales + (size_t)buf * 2 * ATTN_TILE * SB, *sv = sk + ATTN_TILE * SB;
            for (int i = tid; i < ATTN_TILE * nb; i += ATTN_TILE_THREADS) fk[i] = q8_scale(sk[i]), fv[i] = q8_scale(sv[i]);
            __syncthreads();
        }
        if (!ROWS && j == ns - 1) {
            // The new position's row, as the cache will hold it; the block of the kv head's first
            // heads stores it there for later steps. Q8: each warp quantizes a block of 32 (hd % 32
            // == 0, so whole warps take each pass).
            const int tr = pos - j * ATTN_TILE;
            const float *k_row = qkv + (size_t)(n_heads + kvh) * hd, *v_row = k_row + (size_t)n_kv_heads * hd;
            const bool store = blockIdx.x % ht == 0;
            const size_t at = head_base + (size_t)pos * hd;
            for (int d = tid; d < hd; d += ATTN_TILE_THREADS) {
                const float kx = rope_rotate_half<PLAIN>(k_row, d, half, cos_t, sin_t), vx = v_row[d];
                if constexpr (Q8) {
                    uint16_t kd, vd;
                    const int8_t kq = q8_quantize_warp(kx, &kd), vq = q8_quantize_warp(vx, &vd);
                    kc[code_offset<D>(tr, d)] = kq, vc[code_offset<D>(tr, d)] = vq;
                    const int si = d / KV_Q8_BLOCK;
                    if (d % KV_Q8_BLOCK == 0) fk[tr * nb + si] = q8_scale(kd), fv[tr * nb + si] = q8_scale(vd);
                    if (store) {
                        k_q8[at + d] = kq, v_q8[at + d] = vq;
                        if (d % KV_Q8_BLOCK == 0) {
                            const size_t sat = scale_base + (size_t)pos * nb + si;
                            k_scale[sat] = kd, v_scale[sat] = vd;
                        }
                    }
                } else {
                    const uint16_t kb = f32_to_bf16(kx), vb = f32_to_bf16(vx);
                    if (store) k_bf[at + d] = kb, v_bf[at + d] = vb;
                    kt[row_offset<D>(tr, d / 8) + d % 8] = kb;
                    vt[row_offset<D>(tr, d / 8) + d % 8] = vb;
                }
            }
            __syncthreads();
        }

        float s[2][4];
        tile_scores<D, QREG, Q8>(s, Q8 ? (const void *)kc : kt, qh, ql, q_hi, q_lo, fk, nb, warp, lane);
        // Scale to log2 units; positions past pos (and, windowed, before lo) score -inf.
        const int k0 = j * ATTN_TILE + warp * 16;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = k0 + nt * 8 + 2 * t + (e & 1);
                s[nt][e] = key > pos || (!PLAIN && key < lo) ? -INFINITY : s[nt][e] * scale_log2;
            }
        // The online softmax of each of the thread's two rows; a row whose maximum is still -inf
        // (no position of it seen) takes its exponentials against 0, every one of them 0.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_run[r], mx);
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float alpha = exp2f(m_run[r] - m_use);
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
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
        tile_weighted_sum<D, Q8>(o, s, Q8 ? (const void *)vc : vt, fv, nb, j * ATTN_TILE, pos, warp, lane);
        __syncthreads();  // every warp is done with this tile's buffers before they are refilled
    }

    // The warps' states merged in warp order: each warp's (m, l, o) into shared memory (over the
    // tiles' buffers; Q8: o's elements put back in order), then each head's weights 2^(m_w - m)
    // and sum.
    float *wo = reinterpret_cast<float *>(kv);  // [warp][head][D]
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l = l_run[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int hr = g + 8 * r;
        if (t == 0) {
            wm[warp][hr] = m_run[r];
            wl[warp][hr] = l;
        }
        float *wrow = wo + ((size_t)warp * DEC_HEADS + hr) * D;
        if constexpr (Q8) {
#pragma unroll
            for (int c = 0; c < D / 16; ++c)  // q8_out_element: 16c + 4t + (0, 1, 2, 3)
                *reinterpret_cast<float4 *>(wrow + q8_out_element(2 * c, t, 0)) =
                    make_float4(o[2 * c][2 * r], o[2 * c + 1][2 * r], o[2 * c][2 * r + 1], o[2 * c + 1][2 * r + 1]);
        } else {
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt)
                *reinterpret_cast<float2 *>(wrow + dt * 8 + 2 * t) = make_float2(o[dt][2 * r], o[dt][2 * r + 1]);
        }
    }
    __syncthreads();
    if (tid < DEC_HEADS) {
        float m = wm[0][tid];
#pragma unroll
        for (int w = 1; w < DEC_WARPS; ++w) m = fmaxf(m, wm[w][tid]);
        // The weights against m, or where this block writes out and the head has a sink, against
        // top = max(m, sl), the sink's term joining l (AttnSpec::sinks).
        const bool sink = sinks != nullptr && parts == 1 && tid < nh;
        const float sl = sink ? sink_log2(sinks, h0 + tid) : 0.0f, top = sink ? fmaxf(m, sl) : m;
        float l = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) {
            wa[tid][w] = wm[w][tid] == -INFINITY ? 0.0f : exp2f(wm[w][tid] - top);
            l = fmaf(wa[tid][w], wl[w][tid], l);
        }
        if (sink) l += exp2f(sl - top);
        wm[0][tid] = m;
        wsum[tid] = l;
    }
    __syncthreads();
    // Every block holds at least one position of each head, so m is finite and l > 0.
    for (int e = tid; e < nh * hd; e += ATTN_TILE_THREADS) {
        const int r = e / hd, d = e % hd;
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) acc = fmaf(wa[r][w], wo[((size_t)w * DEC_HEADS + r) * D + d], acc);
        if (parts == 1) out[(size_t)(h0 + r) * hd + d] = acc / wsum[r];
        else o_part[((size_t)(h0 + r) * splits + split) * hd + d] = acc;
    }
    if (parts == 1) return;
    if (tid < nh) ml_part[(size_t)(h0 + tid) * splits + split] = make_float2(wm[0][tid], wsum[tid]);

    // Every thread's partials are visible device-wide before the block takes its ticket.
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&done[blockIdx.x], 1u) == (unsigned)(parts - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    // The last block merges the parts (attention_merge.cuh), its weights over the tiles' buffers:
    // 16 * DEC_MAX_SPLITS floats fit every D's tiles.
    merge_parts<VEC, DEC_WARPS, DEC_MAX_SPLITS, DEC_MERGE_BATCH>(nh, h0, hd, splits, parts, ml_part, o_part, sinks,
                                                                reinterpret_cast<float *>(kv), out);
    if (tid == 0) done[blockIdx.x] = 0;
}

uint64_t arc_attention_scratch_bytes(int32_t n_heads, int32_t head_dim, int32_t max_seq) {
    if (n_heads <= 0 || head_dim <= 0 || max_seq <= 0) return 0;
    const uint64_t parts = (uint64_t)n_heads * tiles_splits(max_seq);
    return parts * head_dim * sizeof(float) + parts * sizeof(float2);
}

// What every variant is launched with.
struct TilesArgs {
    const float *qkv;
    RopeArgs rope;
    KvCache kv;
    int n_heads, n_kv_heads, hd, max_seq, splits;
    const int32_t *pos;
    float scale_log2;
    int window;
    const uint16_t *sinks;  // null: none
    float *o_part;
    float2 *ml_part;
    unsigned *done;
    float *out;
    AttnRows rows;  // the decode's one row, or the verify's
};

template <int D, bool ROWS>
static int launch_tiles(arc_context *ctx, const TilesArgs &a) {
    const int group = a.n_heads / a.n_kv_heads, ht = (group + DEC_HEADS - 1) / DEC_HEADS;
    const dim3 grid(a.n_kv_heads * ht, tiles_blocks(a.n_kv_heads * ht, a.splits), a.rows.count);
    const bool plain = a.window == 0 && 2 * a.rope.half == a.hd && a.rope.factor == 1.0f;
    const bool vec = a.hd % 4 == 0 && (uintptr_t)a.o_part % 16 == 0, q8 = a.kv.q8();
    ARC_REQUIRE_AS("decode attention", !q8 || vec, "a q8_0 cache needs 16-byte aligned partials");
    auto kernel = q8 ? (plain ? decode_attention_kernel<D, true, ROWS, true, true>
                              : decode_attention_kernel<D, false, ROWS, true, true>)
                : plain ? (vec ? decode_attention_kernel<D, true, ROWS, true, false>
                               : decode_attention_kernel<D, true, ROWS, false, false>)
                        : (vec ? decode_attention_kernel<D, false, ROWS, true, false>
                               : decode_attention_kernel<D, false, ROWS, false, false>);
    const size_t smem = dec_smem_bytes(D, q8);
    if (smem > 48 * 1024)  // a host-side attribute, legal while capturing
        ARC_CUDA(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return arc_launch_pdl(ctx, ROWS ? "decode_attention_kernel<rows>" : "decode_attention_kernel", kernel, grid,
                          dim3(ATTN_TILE_THREADS), smem, a.qkv, a.rope, a.kv.k, a.kv.v, a.kv.k_scale, a.kv.v_scale,
                          a.n_heads, a.n_kv_heads, a.hd, a.max_seq, a.splits, a.pos, a.scale_log2, a.window, a.o_part,
                          a.ml_part, a.done, a.out, a.rows.stride, a.sinks);
}

// Heads of up to ATTN_TILE_MAX_HEAD_DIM elements (attention_layer sends wider ones to attention_wide.cu).
template <bool ROWS>
static int launch_tiles_hd(arc_context *ctx, const TilesArgs &a) {
    if (a.hd <= 32) return launch_tiles<32, ROWS>(ctx, a);
    if (a.hd <= 64) return launch_tiles<64, ROWS>(ctx, a);
    if (a.hd <= 128) return launch_tiles<128, ROWS>(ctx, a);
    return launch_tiles<256, ROWS>(ctx, a);
}

int attention_layer(arc_context *ctx, const float *qkv, const AttnSpec &spec, const KvCache &kv, int32_t n_heads,
                    int32_t n_kv_heads, int32_t head_dim, int32_t max_seq, const int32_t *pos, float *scratch,
                    float *out, const AttnRows &rows) {
    ARC_REQUIRE(ctx, "ctx is null");
    ARC_REQUIRE(rows.count == 1 || (rows.count > 1 && rows.stride > 0 && rows.done), "rows %d", rows.count);
    const RopeArgs &rope = spec.rope;
    ARC_REQUIRE(qkv && rope.inv_freq && kv.k && kv.v && pos && scratch && out,
                "null pointer (qkv, inv_freq, k_cache, v_cache, pos, scratch and out are required)");
    ARC_REQUIRE(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                "n_heads (%d) must be a positive multiple of n_kv_heads (%d)", n_heads, n_kv_heads);
    ARC_REQUIRE(n_heads <= ARC_ATTN_MAX_GROUPS, "at most %d heads, got %d", ARC_ATTN_MAX_GROUPS, n_heads);
    ARC_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && head_dim <= ATTN_MAX_HEAD_DIM && (head_dim <= 128 || head_dim % 8 == 0),
                "head_dim must be even and in [2, %d] (a multiple of 8 past 128), got %d", ATTN_MAX_HEAD_DIM, head_dim);
    ARC_REQUIRE(head_dim <= ATTN_TILE_MAX_HEAD_DIM || !kv.q8(), "head_dim %d past %d takes a bf16 cache, not q8_0",
                head_dim, ATTN_TILE_MAX_HEAD_DIM);
    ARC_REQUIRE(max_seq > 0 && max_seq <= ATTN_MAX_SEQ, "max_seq must be in [1, %d], got %d",
                ATTN_MAX_SEQ, max_seq);
    const int align = head_dim % 8 == 0 || kv.q8() ? 16 : 4;
    ARC_REQUIRE((uintptr_t)kv.k % align == 0 && (uintptr_t)kv.v % align == 0 && (uintptr_t)kv.k_scale % align == 0 &&
                    (uintptr_t)kv.v_scale % align == 0,
                "the caches must be %d-byte aligned", align);
    ARC_REQUIRE(!kv.q8() || (kv.v_scale && head_dim % KV_Q8_BLOCK == 0),
                "a q8_0 cache takes head_dim %% %d == 0 and both scales, got head_dim %d", KV_Q8_BLOCK, head_dim);
    ARC_REQUIRE((uintptr_t)scratch % 8 == 0, "scratch must be 8-byte aligned");
    ARC_REQUIRE(rope.half >= 1 && 2 * rope.half <= head_dim, "RoPE of %d pairs in a head of %d", rope.half, head_dim);
    ARC_REQUIRE(spec.window >= 0 && spec.scale > 0.0 && isfinite(spec.scale), "window %d, scale %g", spec.window,
                spec.scale);
    if (head_dim > ATTN_TILE_MAX_HEAD_DIM)  // attention_wide.cu, over the same grid and partials
        return wide_decode_attention(ctx, qkv, spec, kv, n_heads, n_kv_heads, head_dim, max_seq, pos, scratch, out,
                                     rows);
    const int splits = tiles_splits(max_seq);
    const size_t part = (size_t)rows.count * n_heads * splits * head_dim;  // the partials of every row
    const TilesArgs a{qkv, rope, kv, n_heads, n_kv_heads, head_dim, max_seq, splits, pos,
                     (float)(1.4426950408889634 * spec.scale), spec.window, spec.sinks, scratch,
                     reinterpret_cast<float2 *>(scratch + part), rows.count > 1 ? rows.done : ctx->attn_done, out, rows};
    // The verify's form for rows already cached: its rows, or a shared layer's one
    return rows.count > 1 || spec.cached ? launch_tiles_hd<true>(ctx, a) : launch_tiles_hd<false>(ctx, a);
}
