// attention_products.cuh -- the decode attention's two products over one tile of 64 cached rows
// (attention.cu): a warp's 16 positions of the tile against the block's 16 query heads, by
// mma.sync, from a bf16 tile or from a q8_0 tile of codes widened to bf16 (kv_cache.cuh).
#pragma once

#include "attention_tile.cuh"
#include "kv_cache.cuh"

// The C fragment of the scores: s[nt][e] is head g + 8 (e / 2) (g = lane / 4) against position
// warp * 16 + nt * 8 + 2 t + e % 2 of the tile (t = lane % 4).
__device__ __forceinline__ int tile_row(int warp, int lane, int nt, int e) { return warp * 16 + nt * 8 + 2 * (lane % 4) + (e & 1); }

// s = Q K^T over the warp's 16 positions (two n8 tiles) of the tile kt (swizzled [64][D]), q as hi +
// lo bf16 parts: from registers (qh, ql: QREG, a k16 step each) or from the tiles q_hi, q_lo. Q8:
// kt holds codes; each block of 32 elements' sums times its key's scale of the block (sk: [64][nb]
// float16 bits), the blocks added in order.
template <int D, bool QREG, bool Q8>
__device__ __forceinline__ void tile_scores(float (&s)[2][4], const uint16_t *kt, const uint32_t (&qh)[QREG ? D / 16 : 1][4],
                                            const uint32_t (&ql)[QREG ? D / 16 : 1][4], const uint16_t *q_hi,
                                            const uint16_t *q_lo, const uint16_t *sk, int nb, int warp, int lane) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    auto qk16 = [&](int kd, float (&acc)[2][4]) {
        uint32_t kf[4];
        ldmatrix_x4(smem_addr(kt + row_offset<D>(warp * 16 + (lane / 16) * 8 + lane % 8, kd * 2 + (lane / 8) % 2)), kf);
        if constexpr (QREG) {
            mma_bf16_16816(acc[0], qh[kd], kf[0], kf[1]);
            mma_bf16_16816(acc[1], qh[kd], kf[2], kf[3]);
            mma_bf16_16816(acc[0], ql[kd], kf[0], kf[1]);
            mma_bf16_16816(acc[1], ql[kd], kf[2], kf[3]);
        } else {
            uint32_t qa[4], qb[4];
            ldmatrix_x4(smem_addr(q_hi + row_offset<D>(lane % 16, kd * 2 + lane / 16)), qa);
            ldmatrix_x4(smem_addr(q_lo + row_offset<D>(lane % 16, kd * 2 + lane / 16)), qb);
            mma_bf16_16816(acc[0], qa, kf[0], kf[1]);
            mma_bf16_16816(acc[1], qa, kf[2], kf[3]);
            mma_bf16_16816(acc[0], qb, kf[0], kf[1]);
            mma_bf16_16816(acc[1], qb, kf[2], kf[3]);
        }
    };
    if constexpr (Q8) {
#pragma unroll
        for (int b = 0; b < D / KV_Q8_BLOCK; ++b) {
            if (b >= nb) break;
            float a[2][4] = {};
            qk16(2 * b, a);
            qk16(2 * b + 1, a);
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = fmaf(a[nt][e], q8_scale(sk[tile_row(warp, lane, nt, e) * nb + b]), s[nt][e]);
        }
    } else {
#pragma unroll
        for (int kd = 0; kd < D / 16; ++kd) qk16(kd, s);
    }
}

// o += P V over the warp's 16 positions of the tile vt (swizzled [64][D]): p, the softmax's
// weights, in the scores' layout, which is an A fragment's; p as hi + lo bf16 parts. Q8: vt holds
// codes; 32 output elements at a time, each weight times its value's scale of the block (sv:
// [64][nb] float16 bits), and 0 for a position past `pos` (first: the tile's first position),
// whose row may hold any scale.
template <int D, bool Q8>
__device__ __forceinline__ void tile_weighted_sum(float (&o)[D / 8][4], const float (&p)[2][4], const uint16_t *vt,
                                                  const uint16_t *sv, int nb, int first, int pos, int warp, int lane) {
    auto pv16 = [&](int dp, const uint32_t (&ph)[4], const uint32_t (&pl)[4]) {
        uint32_t vf[4];
        ldmatrix_x4_trans(smem_addr(vt + row_offset<D>(warp * 16 + ((lane / 8) % 2) * 8 + lane % 8, dp * 2 + lane / 16)), vf);
        mma_bf16_16816(o[2 * dp], ph, vf[0], vf[1]);
        mma_bf16_16816(o[2 * dp + 1], ph, vf[2], vf[3]);
        mma_bf16_16816(o[2 * dp], pl, vf[0], vf[1]);
        mma_bf16_16816(o[2 * dp + 1], pl, vf[2], vf[3]);
    };
    auto split = [](const float (&w)[2][4], uint32_t (&ph)[4], uint32_t (&pl)[4]) {
        split_bf16x2(w[0][0], w[0][1], ph[0], pl[0]);
        split_bf16x2(w[0][2], w[0][3], ph[1], pl[1]);
        split_bf16x2(w[1][0], w[1][1], ph[2], pl[2]);
        split_bf16x2(w[1][2], w[1][3], ph[3], pl[3]);
    };
    uint32_t ph[4], pl[4];
    if constexpr (Q8) {
#pragma unroll
        for (int b = 0; b < D / KV_Q8_BLOCK; ++b) {
            if (b >= nb) break;
            float w[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = tile_row(warp, lane, nt, e);
                    w[nt][e] = first + r <= pos ? p[nt][e] * q8_scale(sv[r * nb + b]) : 0.0f;
                }
            split(w, ph, pl);
            pv16(2 * b, ph, pl);
            pv16(2 * b + 1, ph, pl);
        }
    } else {
        split(p, ph, pl);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) pv16(dp, ph, pl);
    }
}
