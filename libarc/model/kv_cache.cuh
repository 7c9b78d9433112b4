// kv_cache.cuh -- a layer's KV cache as the attention kernels write and read it, in either form of
// arc_model.h's arc_kv_form: bf16 rows, or q8_0 rows (int8 codes, a float16 scale a block of 32).
// The q8_0 kernels keep the tensor-core products of the bf16 ones: a code is an integer of at most
// 7 bits, exact as a bf16, so codes multiply as bf16 values would, and the scales are applied to
// the products' sums (q . k: a block of 32 elements' sum times its key's scale) or to the softmax
// weights (p v: each weight times its value's scale, a block of 32 output elements at a time). The
// decode reads a tile of codes by ldmatrix as it would a bf16 tile and widens each fragment in
// registers (q8_pairs_bf16); the prefill widens the rows it attends to bf16 first (kv_widen).
#pragma once

#include <cuda_fp16.h>

#include "attention_tile.cuh"

enum { KV_Q8_BLOCK = 32 };

static_assert((int)ATTN_TILE == (int)KV_PAD_ROWS, "a tile's scales are one run of the padded rows");

// A block of 32 elements, lane i of a warp holding element i (every lane active): lane i's code,
// and the block's scale as stored (float16 bits) in *d_bits. arc_kv_form's roundings: d = amax /
// 127, code = round(|x| / d) (halves away from zero, at most 127) with x's sign, 1 / d taken once.
__device__ __forceinline__ int8_t q8_quantize_warp(float x, uint16_t *d_bits) {
    const float d = warp_max(fabsf(x)) / 127.0f;
    const float inv = d == 0.0f ? 0.0f : 1.0f / d;
    const float q = fminf(roundf(fabsf(__fmul_rn(x, inv))), 127.0f);
    *d_bits = __half_as_ushort(__float2half_rn(d));
    return (int8_t)copysignf(q, x);
}

__device__ __forceinline__ float q8_scale(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

// Four codes (bytes b0..b3 of w) as two pairs of bf16 values, exactly: lo = (b0, b2), hi = (b1,
// b3), the first of each pair in the low half. A code c is lo7 - 128 b7 (two's complement), and
// bf16 holds 128 + lo7 (exponent 7, lo7 its mantissa) and 128 + 128 b7 exactly, so one bf16x2
// subtraction of the two gives c: no conversion instruction. (sm_80 has no bf16x2 subtraction:
// there it is b * -1 + a, as exact.)
__device__ __forceinline__ void q8_pairs_bf16(uint32_t w, uint32_t &lo, uint32_t &hi) {
    const uint32_t w8 = w >> 8;
    const uint32_t a0 = (w & 0x007F007Fu) | 0x43004300u, b0 = (w & 0x00800080u) | 0x43004300u;
    const uint32_t a1 = (w8 & 0x007F007Fu) | 0x43004300u, b1 = (w8 & 0x00800080u) | 0x43004300u;
#if __CUDA_ARCH__ >= 900
    asm("sub.rn.bf16x2 %0, %1, %2;\n" : "=r"(lo) : "r"(a0), "r"(b0));
    asm("sub.rn.bf16x2 %0, %1, %2;\n" : "=r"(hi) : "r"(a1), "r"(b1));
#else
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(lo) : "r"(b0), "r"(0xBF80BF80u), "r"(a0));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(hi) : "r"(b1), "r"(0xBF80BF80u), "r"(a1));
#endif
}

// Byte offset of (row, element d) in a tile of rows of D codes: 16-byte chunks swizzled by the row
// as a bf16 tile's (row_offset), so that the 8 rows one ldmatrix reads lie on distinct banks.
template <int D>
__device__ __forceinline__ int code_offset(int row, int d) { return 2 * row_offset<D / 2>(row, d / 16) + d % 16; }

// A warp stores element d (lane d % 32 of its block) of a row of hd elements at row `row` of kv
// head `head` of a q8_0 plane: its code, and lane 0 the block's scale. Returns the code.
__device__ __forceinline__ int8_t q8_store_warp(float x, int8_t *codes, uint16_t *scales, int head, int row, int d,
                                                int hd, int max_seq) {
    uint16_t bits;
    const int8_t q = q8_quantize_warp(x, &bits);
    codes[((size_t)head * max_seq + row) * hd + d] = q;
    if (d % KV_Q8_BLOCK == 0)
        scales[((size_t)head * kv_seq_pad(max_seq) + row) * (hd / KV_Q8_BLOCK) + d / KV_Q8_BLOCK] = bits;
    return q;
}

// 64 rows of q8_0 codes (row r at src + r * hd, hd % 16 == 0, 16-byte aligned) into a swizzled
// [64][D] byte tile (code_offset), rows at or past `rows` and bytes past hd as zeros; cp.async, not
// committed.
template <int D>
__device__ __forceinline__ void load_code_rows(int8_t *tile, const int8_t *src, int rows, int hd, int tid) {
    constexpr int CPR = D / 16;
    const uint32_t base = smem_addr(tile);
    for (int e = tid; e < ATTN_TILE * CPR; e += ATTN_TILE_THREADS) {
        const int r = e / CPR, c = e % CPR;
        const bool ok = r < rows && c * 16 < hd;
        cp_async16(base + code_offset<D>(r, c * 16), ok ? src + (size_t)r * hd + c * 16 : src, ok);
    }
}

// A tile's 64 rows of scales (64 * hd / 32 float16 words, one 16-byte aligned run) into `tile`;
// cp.async, not committed.
__device__ __forceinline__ void load_scale_rows(uint16_t *tile, const uint16_t *src, int hd, int tid) {
    const uint32_t base = smem_addr(tile);
    for (int e = tid; e < ATTN_TILE * (hd / KV_Q8_BLOCK) / 8; e += ATTN_TILE_THREADS) cp_async16(base + e * 16, src + e * 8, true);
}

// A model's KV cache (kv_cache.cu): one allocation of the planes of its form (arc_model_kv_planes),
// plane i at base + at[i] holding (layers, n_kv_heads, rows[i], row_bytes[i]): bf16's k and v
// values; q8_0's k and v codes, then their scales (rows kv_seq_pad(max_seq)). q8_0 also allocates
// `wide`, the prefill's widened rows of one layer.
struct KvPlanes {
    uint8_t *base = nullptr;
    int count = 0;
    int head_dim = 0;  // the config's: row_bytes[i] is a row's at it (a layer of wider heads: in proportion)
    uint64_t at[ARC_KV_MAX_PLANES] = {}, rows[ARC_KV_MAX_PLANES] = {}, row_bytes[ARC_KV_MAX_PLANES] = {};
    uint64_t bytes = 0;
    uint16_t *wide = nullptr;
    uint64_t wide_bytes = 0;
};
// Allocates (zeros) the planes of config c's form for its attention layers (one layer's where it has
// none), each layer holding its own kv heads of its own width (layer_dims); release frees them.
int kv_planes_create(arc_context *ctx, const arc_model_config &c, KvPlanes *kv);
void kv_planes_release(KvPlanes *kv);
// Attention layer `layer` of config c as its kernels take it.
KvCache kv_planes_layer(const KvPlanes &kv, const arc_model_config &c, int layer);

// The prefill's widening of a layer's q8_0 rows lo..hi - 1 into kv.wide (kv_cache.cu).
int kv_widen(arc_context *ctx, const KvCache &kv, int n_kv_heads, int hd, int max_seq, int lo, int hi);
