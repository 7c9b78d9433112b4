// attention.cuh -- how the decode's attention kernel (attention.cu) lays a chunk of cached k or v
// rows over a block's lanes, and reads them.
#pragma once

#include "kernels.cuh"

enum { ATTN_THREADS = 128, ATTN_WARPS = ATTN_THREADS / 32, ATTN_UNROLL = 8, ATTN_MERGE = 4, ATTN_GRID_BLOCKS = 1024 };

// VEC bf16 values of a cache row as floats: 16-byte loads when head_dim % 8 == 0, else 4-byte.
template <int VEC>
__device__ __forceinline__ void load_row(const uint16_t *p, float *f) {
    if constexpr (VEC == 8) {
        const uint4 g = *reinterpret_cast<const uint4 *>(p);
        f[0] = bf16_lo(g.x); f[1] = bf16_hi(g.x); f[2] = bf16_lo(g.y); f[3] = bf16_hi(g.y);
        f[4] = bf16_lo(g.z); f[5] = bf16_hi(g.z); f[6] = bf16_lo(g.w); f[7] = bf16_hi(g.w);
    } else {
        const uint32_t g = *reinterpret_cast<const uint32_t *>(p);
        f[0] = bf16_lo(g); f[1] = bf16_hi(g);
    }
}

// A float rounded to bf16 (nearest even) and back: the value the cache holds.
__device__ __forceinline__ float as_cached(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// How the threads of a block share a chunk. LP lanes hold one position (each NV vectors of VEC
// elements of its row; vector j = sub + LP * i of the row); a warp holds 32 / LP positions, a block
// step ATTN_THREADS / LP, and a block ATTN_UNROLL steps: CHUNK positions, all loaded at once.
template <int VEC, int LP>
struct AttnLayout {
    static constexpr int NV = VEC == 8 ? 1 : 2;  // VEC == 2 runs with LP == 32: hd / 2 <= 64 = 32 * NV
    static constexpr int E = NV * VEC;           // elements of a head row per lane
    static constexpr int PPW = 32 / LP;          // positions per warp
    static constexpr int PG = ATTN_THREADS / LP; // positions per block step
    static constexpr int CHUNK = PG * ATTN_UNROLL;
    static constexpr int HD = LP * E;            // the longest head row the layout holds
};

// The ATTN_UNROLL rows of the chunk this lane helps hold (row t = warp * PPW + PG * u + pw), its
// vectors of each; rows at or past `rows`, and vectors past the row's nvh, read as zeros.
template <int VEC, int LP>
__device__ __forceinline__ void load_chunk(const uint16_t *base, int hd, int nvh, int rows, int warp, int pw,
                                           int sub, float (&f)[ATTN_UNROLL][AttnLayout<VEC, LP>::E]) {
    using L = AttnLayout<VEC, LP>;
#pragma unroll
    for (int u = 0; u < ATTN_UNROLL; ++u) {
        const int t = warp * L::PPW + L::PG * u + pw;
#pragma unroll
        for (int i = 0; i < L::NV; ++i) {
            const int j = sub + LP * i;
            if (t < rows && j < nvh) {
                load_row<VEC>(base + (size_t)t * hd + j * VEC, &f[u][i * VEC]);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) f[u][i * VEC + e] = 0.0f;
            }
        }
    }
}
