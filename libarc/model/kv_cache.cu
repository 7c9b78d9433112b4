// kv_cache.cu -- the prefill's widening of a q8_0 cache's rows to bf16 (kv_cache.cuh), which its
// flash kernel then reads as it reads a bf16 cache.
#include "kv_cache.cuh"

enum { WIDEN_THREADS = 256, WIDEN_MAX_BLOCKS = 512 };

// Rows lo..hi - 1 of kv head blockIdx.y of k (blockIdx.z 0) or v (1): each code times its block's
// scale, rounded to nearest even, into the same place of kv.wide; 8 elements a thread a pass.
__global__ void __launch_bounds__(WIDEN_THREADS)
kv_widen_kernel(const KvCache kv, int n_kv_heads, int hd, int max_seq, int lo, int hi) {
    pdl_launch_dependents();
    pdl_wait();  // the chunk's rows are the previous kernel's
    const int h = blockIdx.y, which = blockIdx.z, nb = hd / KV_Q8_BLOCK;
    const int8_t *codes = static_cast<const int8_t *>(which ? kv.v : kv.k);
    const uint16_t *scales = (which ? kv.v_scale : kv.k_scale) + (size_t)h * kv_seq_pad(max_seq) * nb;
    uint16_t *wide = kv.wide + (size_t)which * n_kv_heads * max_seq * hd;
    const size_t first = (size_t)lo * hd / 8, last = (size_t)hi * hd / 8;
    for (size_t e = first + blockIdx.x * (size_t)WIDEN_THREADS + threadIdx.x; e < last;
         e += (size_t)gridDim.x * WIDEN_THREADS) {
        const int row = (int)(e * 8 / hd), d = (int)(e * 8 % hd);
        const size_t at = ((size_t)h * max_seq + row) * hd + d;
        const float sc = q8_scale(scales[(size_t)row * nb + d / KV_Q8_BLOCK]);
        const uint2 w = *reinterpret_cast<const uint2 *>(codes + at);
        uint32_t out[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t word = i < 2 ? w.x : w.y, sh = (i % 2) * 16;
            const float a = __fmul_rn((float)(int8_t)(word >> sh), sc), b = __fmul_rn((float)(int8_t)(word >> (sh + 8)), sc);
            out[i] = (uint32_t)f32_to_bf16(a) | ((uint32_t)f32_to_bf16(b) << 16);
        }
        *reinterpret_cast<uint4 *>(wide + at) = make_uint4(out[0], out[1], out[2], out[3]);
    }
}

int kv_widen(arc_context *ctx, const KvCache &kv, int n_kv_heads, int hd, int max_seq, int lo, int hi) {
    ARC_REQUIRE(kv.q8() && kv.wide && hd % KV_Q8_BLOCK == 0 && 0 <= lo && lo < hi && hi <= max_seq,
                "rows %d..%d of a q8_0 cache of %d (head_dim %d)", lo, hi, max_seq, hd);
    const size_t n8 = (size_t)(hi - lo) * hd / 8;
    const unsigned blocks = (unsigned)((n8 + WIDEN_THREADS - 1) / WIDEN_THREADS);
    const dim3 grid(blocks < WIDEN_MAX_BLOCKS ? blocks : WIDEN_MAX_BLOCKS, n_kv_heads, 2);
    return arc_launch_pdl(ctx, "kv_widen_kernel", kv_widen_kernel, grid, dim3(WIDEN_THREADS), 0, kv, n_kv_heads, hd,
                          max_seq, lo, hi);
}
