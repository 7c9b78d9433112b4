// kv_cache.cu -- the KV cache's planes, each attention layer's rows in its own dims (kv_cache.cuh),
// and the prefill's widening of a q8_0 cache's rows to bf16, which its flash kernel then reads as it
// reads a bf16 cache.
#include "kv_cache.cuh"

#include "model/forward/layer.cuh"

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

// Bytes of plane i of one kv head of heads of hd elements: rows[i] rows in proportion to the config's.
static uint64_t head_bytes(const KvPlanes &kv, int i, int hd) {
    return kv.rows[i] * (kv.row_bytes[i] * (uint64_t)hd / (uint64_t)kv.head_dim);
}

// Bytes of plane i that the attention layers before `layer` hold (every one of them: n_layers); a
// shared layer holds none (it attends its source layer's rows).
static uint64_t layers_bytes(const KvPlanes &kv, const arc_model_config &c, int i, int layer) {
    uint64_t n = 0;
    for (int l = 0; l < layer; ++l) {
        if (layer_dn(c, l) || layer_shared(c, l)) continue;
        const AttnDims d = layer_dims(c, l);
        n += (uint64_t)d.n_kv * head_bytes(kv, i, d.hd);
    }
    return n;
}

int kv_planes_create(arc_context *ctx, const arc_model_config &c, KvPlanes *kv) {
    const bool q8 = c.kv_cache == ARC_KV_Q8_0;
    kv->count = q8 ? 4 : 2;
    kv->head_dim = c.head_dim;
    uint64_t at = 0;
    for (int i = 0; i < kv->count; ++i) {
        const bool scales = i >= 2;
        kv->rows[i] = scales ? (uint64_t)kv_seq_pad(c.max_seq) : (uint64_t)c.max_seq;
        kv->row_bytes[i] = scales ? (uint64_t)c.head_dim / KV_Q8_BLOCK * 2 : (uint64_t)c.head_dim * (q8 ? 1 : 2);
        kv->at[i] = at;
        uint64_t n = layers_bytes(*kv, c, i, c.n_layers);
        if (n == 0) n = (uint64_t)c.n_kv_heads * head_bytes(*kv, i, c.head_dim);  // DeltaNet layers alone: one layer's
        at = (at + n + 255) / 256 * 256;
    }
    kv->bytes = at;
    ARC_CUDA(ctx, cudaMalloc(&kv->base, kv->bytes));
    // Positions not yet written are never read; zeros keep a stray read finite and repeatable.
    ARC_CUDA(ctx, cudaMemsetAsync(kv->base, 0, kv->bytes, ctx->stream));
    if (q8) {
        const AttnDims most = max_layer_dims(c);
        kv->wide_bytes = (uint64_t)2 * most.n_kv * c.max_seq * most.hd * 2;
        ARC_CUDA(ctx, cudaMalloc(&kv->wide, kv->wide_bytes));
        ARC_CUDA(ctx, cudaMemsetAsync(kv->wide, 0, kv->wide_bytes, ctx->stream));
    }
    return ARC_OK;
}

void kv_planes_release(KvPlanes *kv) {
    if (kv->base) cudaFree(kv->base);
    if (kv->wide) cudaFree(kv->wide);
    *kv = KvPlanes{};
}

KvCache kv_planes_layer(const KvPlanes &kv, const arc_model_config &c, int layer) {
    layer = layer_kv_source(c, layer);  // a shared layer's rows are its source's
    void *plane[ARC_KV_MAX_PLANES] = {};
    for (int i = 0; i < kv.count; ++i) plane[i] = kv.base + kv.at[i] + layers_bytes(kv, c, i, layer);
    return KvCache{plane[0], plane[1], (uint16_t *)plane[2], (uint16_t *)plane[3], kv.wide};
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
