// embedding.cuh -- a token's row of the embedding table (embedding.cu): the device gather the
// decode's embedding and the prefill's rows share, and the scaled launcher.
#pragma once

#include "device_math.cuh"

// x[dim] = float(table[tok, :]) * scale, table bf16 (vocab, dim), by the block's threads (nthreads);
// a token outside [0, vocab) fills x with NaN instead of reading out of bounds. dim % 8 == 0,
// table and x 16-byte aligned. The decode's embedding and the prefill's rows gather alike.
__device__ __forceinline__ void embed_row(const uint16_t *__restrict__ table, int vocab, int dim, uint32_t tok,
                                          float scale, float *__restrict__ x, int nthreads) {
    const int nvec = dim / 8;
    float4 *x4 = reinterpret_cast<float4 *>(x);
    if (tok >= (uint32_t)vocab) {
        const float nan = quiet_nan();
        for (int v = threadIdx.x; v < nvec; v += nthreads) {
            x4[2 * v] = make_float4(nan, nan, nan, nan);
            x4[2 * v + 1] = make_float4(nan, nan, nan, nan);
        }
        return;
    }
    const uint4 *row = reinterpret_cast<const uint4 *>(table + (size_t)tok * dim);
    for (int v = threadIdx.x; v < nvec; v += nthreads) {
        const uint4 g = row[v];
        x4[2 * v] = make_float4(bf16_lo(g.x) * scale, bf16_hi(g.x) * scale, bf16_lo(g.y) * scale, bf16_hi(g.y) * scale);
        x4[2 * v + 1] = make_float4(bf16_lo(g.z) * scale, bf16_hi(g.z) * scale, bf16_lo(g.w) * scale,
                                    bf16_hi(g.w) * scale);
    }
}

// An embedding table, bf16 (vocab, dim), and the factor its rows are scaled by (a config's
// embed_scale; 1 for arc_op_embedding).
struct EmbedTable {
    const uint16_t *table = nullptr;
    int32_t vocab = 0, dim = 0;
    float scale = 1.0f;
};
// arc_op_embedding with the rows scaled: x = row *token of e, times e.scale.
int embedding_scaled(arc_context *ctx, const EmbedTable &e, const uint32_t *token, float *x);
