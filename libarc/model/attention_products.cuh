// attention_products.cuh -- the decode attention's two products over one tile of 64 cached rows
// (attention.cu): a warp's 16 positions of the tile against the block's 16 query heads, by
// mma.sync, from a bf16 tile or from a q8_0 tile of codes widened to bf16 in registers
// (kv_cache.cuh).
#pragma once

#include "attention_tile.cuh"
#include "kv_cache.cuh"

// The C fragment of the scores: s[nt][e] is head g + 8 (e / 2) (g = lane / 4) against position
// warp * 16 + nt * 8 + 2 t + e % 2 of the tile (t = lane % 4).
__device__ __forceinline__ int tile_row(int warp, int lane, int nt, int e) { return warp * 16 + nt * 8 + 2 * (lane % 4) + (e & 1); }

// The address lane gives an ldmatrix of four 8x16-byte matrices of a q8_0 tile (code_offset): the
// warp's 16 positions and block b's 32 elements, matrix i holding positions 8 (i % 2).. and
// elements 32 b + 16 (i / 2)...
template <int D>
__device__ __forceinline__ uint32_t code_matrices(const int8_t *ct, int warp, int lane, int b) {
    return smem_addr(ct + code_offset<D>(warp * 16 + ((lane / 8) % 2) * 8 + lane % 8, 32 * b + 16 * (lane / 16)));
}

// s = Q K^T over the warp's 16 positions (two n8 tiles) of the tile kt (swizzled [64][D]), q as hi +
// lo bf16 parts: from registers (qh, ql: QREG, a k16 step each) or from the tiles q_hi, q_lo.
// Q8: kt holds codes (code_offset) and q's tiles hold each 16 elements in q8_k_slot's order, the
// order in which one ldmatrix of a row's 16 codes hands a thread its codes (4t..4t + 3, as the
// pairs (4t, 4t + 2) and (4t + 1, 4t + 3)); each block of 32 elements' sums times its key's scale
// of the block (sk: [64][nb] floats), the blocks added in order.
template <int D, bool QREG, bool Q8>
__device__ __forceinline__ void tile_scores(float (&s)[2][4], const void *kt, const uint32_t (&qh)[QREG ? D / 16 : 1][4],
                                            const uint32_t (&ql)[QREG ? D / 16 : 1][4], const uint16_t *q_hi,
                                            const uint16_t *q_lo, const float *sk, int nb, int warp, int lane) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    // acc += q's k16 step kd against the two n8 tiles' operands b[0..1] and b[2..3].
    auto qk16 = [&](int kd, float (&acc)[2][4], const uint32_t (&b)[4]) {
        if constexpr (QREG) {
            mma_bf16_16816(acc[0], qh[kd], b[0], b[1]);
            mma_bf16_16816(acc[1], qh[kd], b[2], b[3]);
            mma_bf16_16816(acc[0], ql[kd], b[0], b[1]);
            mma_bf16_16816(acc[1], ql[kd], b[2], b[3]);
        } else {
            uint32_t qa[4], qb[4];
            ldmatrix_x4(smem_addr(q_hi + row_offset<D>(lane % 16, kd * 2 + lane / 16)), qa);
            ldmatrix_x4(smem_addr(q_lo + row_offset<D>(lane % 16, kd * 2 + lane / 16)), qb);
            mma_bf16_16816(acc[0], qa, b[0], b[1]);
            mma_bf16_16816(acc[1], qa, b[2], b[3]);
            mma_bf16_16816(acc[0], qb, b[0], b[1]);
            mma_bf16_16816(acc[1], qb, b[2], b[3]);
        }
    };
    if constexpr (Q8) {
        const int8_t *ct = static_cast<const int8_t *>(kt);
#pragma unroll
        for (int b = 0; b < D / KV_Q8_BLOCK; ++b) {
            if (b >= nb) break;
            uint32_t w[4], f0[4], f1[4];
            ldmatrix_x4(code_matrices<D>(ct, warp, lane, b), w);
            q8_pairs_bf16(w[0], f0[0], f0[1]);
            q8_pairs_bf16(w[1], f0[2], f0[3]);
            q8_pairs_bf16(w[2], f1[0], f1[1]);
            q8_pairs_bf16(w[3], f1[2], f1[3]);
            float a[2][4] = {};
            qk16(2 * b, a, f0);
            qk16(2 * b + 1, a, f1);
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = fmaf(a[nt][e], sk[tile_row(warp, lane, nt, e) * nb + b], s[nt][e]);
        }
    } else {
        const uint16_t *bt = static_cast<const uint16_t *>(kt);
#pragma unroll
        for (int kd = 0; kd < D / 16; ++kd) {
            uint32_t kf[4];
            ldmatrix_x4(smem_addr(bt + row_offset<D>(warp * 16 + (lane / 16) * 8 + lane % 8, kd * 2 + (lane / 8) % 2)), kf);
            qk16(kd, s, kf);
        }
    }
}

// The k16 slot of element d (0..15) of a 16-element step in a q8_0 tile's products (tile_scores):
// the thread of t = d / 4 holds elements 4t and 4t + 2 in slots 2t and 2t + 1, elements 4t + 1 and
// 4t + 3 in slots 2t + 8 and 2t + 9.
__device__ __forceinline__ int q8_k_slot(int d) { return 2 * (d >> 2) + ((d >> 1) & 1) + 8 * (d & 1); }

// The output element of a q8_0 tile's weighted sum (tile_weighted_sum) held in o[nt][e]: a
// transposed ldmatrix of 16 codes hands a thread positions 2t, 2t + 1 of elements 2g and 2g + 1,
// so n8 tile 2c holds the even elements of 16c..16c + 15 and tile 2c + 1 the odd ones.
__device__ __forceinline__ int q8_out_element(int nt, int t, int e) { return 16 * (nt / 2) + 4 * t + 2 * (e & 1) + nt % 2; }

// o += P V over the warp's 16 positions of the tile vt (swizzled [64][D]): p, the softmax's
// weights, in the scores' layout, which is an A fragment's; p as hi + lo bf16 parts. Q8: vt holds
// codes (code_offset) and o's elements lie as q8_out_element says; 32 output elements at a time,
// each weight times its value's scale of the block (sv: [64][nb] floats), and 0 for a
// position past `pos` (first: the tile's first position), whose row may hold any scale.
template <int D, bool Q8>
__device__ __forceinline__ void tile_weighted_sum(float (&o)[D / 8][4], const float (&p)[2][4], const void *vt,
                                                  const float *sv, int nb, int first, int pos, int warp, int lane) {
    auto split = [](const float (&w)[2][4], uint32_t (&ph)[4], uint32_t (&pl)[4]) {
        split_bf16x2(w[0][0], w[0][1], ph[0], pl[0]);
        split_bf16x2(w[0][2], w[0][3], ph[1], pl[1]);
        split_bf16x2(w[1][0], w[1][1], ph[2], pl[2]);
        split_bf16x2(w[1][2], w[1][3], ph[3], pl[3]);
    };
    uint32_t ph[4], pl[4];
    if constexpr (Q8) {
        const int8_t *ct = static_cast<const int8_t *>(vt);
#pragma unroll
        for (int b = 0; b < D / KV_Q8_BLOCK; ++b) {
            if (b >= nb) break;
            float w[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = tile_row(warp, lane, nt, e);
                    w[nt][e] = first + r <= pos ? p[nt][e] * sv[r * nb + b] : 0.0f;
                }
            split(w, ph, pl);
            // Each word's pairs are the even and the odd elements' operands.
            uint32_t c[4];
            ldmatrix_x4_trans(code_matrices<D>(ct, warp, lane, b), c);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint32_t e0, o0, e1, o1;
                q8_pairs_bf16(c[2 * h], e0, o0);
                q8_pairs_bf16(c[2 * h + 1], e1, o1);
                const int nt = 4 * b + 2 * h;
                mma_bf16_16816(o[nt], ph, e0, e1);
                mma_bf16_16816(o[nt + 1], ph, o0, o1);
                mma_bf16_16816(o[nt], pl, e0, e1);
                mma_bf16_16816(o[nt + 1], pl, o0, o1);
            }
        }
    } else {
        const uint16_t *bt = static_cast<const uint16_t *>(vt);
        split(p, ph, pl);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            uint32_t vf[4];
            ldmatrix_x4_trans(smem_addr(bt + row_offset<D>(warp * 16 + ((lane / 8) % 2) * 8 + lane % 8, dp * 2 + lane / 16)), vf);
            mma_bf16_16816(o[2 * dp], ph, vf[0], vf[1]);
            mma_bf16_16816(o[2 * dp + 1], ph, vf[2], vf[3]);
            mma_bf16_16816(o[2 * dp], pl, vf[0], vf[1]);
            mma_bf16_16816(o[2 * dp + 1], pl, vf[2], vf[3]);
        }
    }
}
