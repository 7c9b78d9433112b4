// attention_tile.cuh -- the tiles of cached k and v rows that the tensor-core attention kernels
// (prefill_attention.cu, attention.cu) stage in shared memory: the swizzled layout and the
// loader; and the sinks' logits they read, and the prefill's normalization with them.
#pragma once

#include "kernels.cuh"

// Every attention kernel stages tiles of 64 cache rows with 128 threads.
enum { ATTN_TILE = 64, ATTN_TILE_THREADS = 128 };

// Element offset of (row, 8-element chunk) in a tile of rows of D elements; chunks are XOR-
// swizzled by the row so that the 8 rows one ldmatrix reads lie on distinct banks.
template <int D>
__device__ __forceinline__ int row_offset(int row, int chunk) {
    constexpr int CPR = D / 8;
    const int sw = CPR >= 8 ? (row & 7) : ((row >> 1) & (CPR - 1));
    return row * D + ((chunk ^ sw) << 3);
}

// 64 rows of hd bf16 elements, row r at src + r * stride (rows at or past `rows` and elements at
// or past hd read as zeros), into a swizzled [64][D] tile, by the block's ATTN_TILE_THREADS
// threads. cp.async when rows are 16-byte aligned (hd % 8 == 0); otherwise plain 4-byte loads,
// complete on return.
template <int D>
__device__ __forceinline__ void load_rows(uint16_t *tile, const uint16_t *src, size_t stride, int rows, int hd,
                                          int tid) {
    constexpr int CPR = D / 8;
    if (hd % 8 == 0) {
        const uint32_t base = smem_addr(tile);
        for (int e = tid; e < ATTN_TILE * CPR; e += ATTN_TILE_THREADS) {
            const int r = e / CPR, c = e % CPR;
            const bool ok = r < rows && c * 8 < hd;
            cp_async16(base + row_offset<D>(r, c) * 2, ok ? src + r * stride + c * 8 : src, ok);
        }
    } else {
        for (int e = tid; e < ATTN_TILE * (D / 2); e += ATTN_TILE_THREADS) {
            const int r = e / (D / 2), d = (e % (D / 2)) * 2;
            const uint32_t v = r < rows && d < hd ? *reinterpret_cast<const uint32_t *>(src + r * stride + d) : 0u;
            *reinterpret_cast<uint32_t *>(tile + row_offset<D>(r, d / 8) + d % 8) = v;
        }
    }
}

// A float as the sum of two bf16 values, hi = bf16(x) and lo = bf16(x - hi), packed in pairs for a
// tensor-core operand: products with a bf16 operand then carry about 16 bits of x, not 8.
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t &hi, uint32_t &lo) {
    hi = pack_bf16x2(a, b);
    lo = pack_bf16x2(a - bf16_lo(hi), b - bf16_hi(hi));
}

// Head h's sink logit (AttnSpec::sinks) in the kernels' log2 units: the bf16 word widened, times
// log2(e), rounded once.
__device__ __forceinline__ float sink_log2(const uint16_t *sinks, int h) {
    return __fmul_rn(bf16_to_f32(sinks[h]), 1.4426950408889634f);
}

// The factor that normalizes a query's output o (its sums against m, its maximum score in log2
// units, and l its sum of exponentials): 1 / l, or with head h's sink sl (sinks not null,
// sink_log2) a / (l a + b), a = 2^(m - M), b = 2^(sl - M), M = max(m, sl): the sink joins the
// denominator alone. Neither exponent is positive and one is 0, so l a + b lies between about 1
// and l + 1: a sink far above the scores gives a factor that underflows to 0, one far below
// exactly 1 / l, never inf or NaN. Without sinks the factor is 1 / l, the plain softmax's.
__device__ __forceinline__ float prefill_norm(float m, float l, const uint16_t *sinks, int h) {
    if (!sinks) return 1.0f / l;
    const float sl = sink_log2(sinks, h), top = fmaxf(m, sl);
    const float a = exp2f(m - top), b = exp2f(sl - top);
    return a / __fmaf_rn(l, a, b);
}
