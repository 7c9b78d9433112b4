// gemm_tile.cuh -- what the prefill's two mma.sync products share (gemm.cu over bf16 weights,
// gemm_quant.cu over packed ones; their arguments are gemm.cuh's): the tile shapes, the swizzled
// tile layout, one stage's tensor-core work and the epilogue. Both kernels add the same products in the same
// order (k ascending, 16 at a time, one float32 accumulator an output), so for the same bf16
// weights they give the same bits, whatever the tile shape.
#pragma once

#include "device_math.cuh"
#include "gemm.cuh"
#include "launch.cuh"
#include "model/tensor_core.cuh"

enum { GEMM_BK = 64, GEMM_CHUNKS = GEMM_BK / 8 };  // k per stage; 16-byte chunks per tile row

// A grouped product's weights: expert blockIdx.z's (data no kernel writes: before pdl_wait too).
__device__ __forceinline__ void group_weights(GemmArgs &p) {
    if (!p.offsets) return;
    p.w = reinterpret_cast<const uint8_t *>(p.w) + blockIdx.z * p.w_step;
    if (p.bias) p.bias += blockIdx.z * p.bias_step;
}

// A grouped product's rows: p narrowed to expert blockIdx.z's, false where the block's rows from
// m0 hold none of them (the whole block then returns). After pdl_wait: the offsets are an earlier
// kernel's.
__device__ __forceinline__ bool group_rows(GemmArgs &p, int m0) {
    if (!p.offsets) return true;
    const int base = p.offsets[blockIdx.z];
    p.m = p.offsets[blockIdx.z + 1] - base;
    if (m0 >= p.m) return false;
    if (p.a_rows) p.a_rows += base;
    else p.a += (size_t)base * p.k;
    if (p.c) p.c += (size_t)base * p.ldc;
    if (p.h) p.h += (size_t)base * p.n;
    return true;
}

// Element offset of (row, 8-element chunk) in a tile of rows of GEMM_BK elements.
__device__ __forceinline__ int tile_offset(int row, int chunk) { return row * GEMM_BK + ((chunk ^ (row & 7)) << 3); }

// The tile shape: BM x BN outputs per block, WARPS_M x WARPS_N warps, each WM x WN of them.
template <int BM_, int BN_, int WARPS_M_, int WARPS_N_, int STAGES_, int MIN_BLOCKS_>
struct GemmTile {
    static constexpr int BM = BM_, BN = BN_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, STAGES = STAGES_;
    static constexpr int MIN_BLOCKS = MIN_BLOCKS_;
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
    static constexpr int MI = WM / 16, NI = WN / 8;  // mma tiles per warp
    static constexpr int SMEM = STAGES * (BM + BN) * GEMM_BK * 2;
    static_assert(WM % 16 == 0 && WN % 16 == 0, "a warp covers whole 16x16 fragment pairs");
    static_assert((BM * GEMM_CHUNKS) % THREADS == 0 && (BN * GEMM_CHUNKS) % THREADS == 0, "even tile loads");
};

// The weight row that row r of a block's W tile holds, or -1 past the end. SWIGLU interleaves
// per warp: of the WN rows of warp column wn, the first half are gate rows and the second half
// the up rows of the same outputs (`up` rows after them), so each thread ends with a gate and its
// up in registers.
template <class T, int EPI>
__device__ __forceinline__ int weight_row(int r, int block_n, int n, int up) {
    if constexpr (EPI == EPI_SWIGLU) {
        constexpr int HALF = T::WN / 2;
        const int wn = r / T::WN, within = r % T::WN;
        const int out = block_n * (T::BN / 2) + wn * HALF + within % HALF;
        if (out >= n) return -1;
        return within < HALF ? out : up + out;
    } else {
        const int row = block_n * T::BN + r;
        return row < n ? row : -1;
    }
}

// The A rows [m0, m0 + BM) of one stage, columns [k0, k0 + GEMM_BK), into sa by cp.async;
// chunks past m or k are zero-filled.
template <class T>
__device__ __forceinline__ void load_a_stage(const GemmArgs &p, uint16_t *sa, int m0, int k0, int tid) {
    const uint32_t a_base = smem_addr(sa);
#pragma unroll
    for (int i = 0; i < T::BM * GEMM_CHUNKS / T::THREADS; ++i) {
        const int idx = tid + i * T::THREADS, row = idx / GEMM_CHUNKS, chunk = idx % GEMM_CHUNKS;
        const int k = k0 + chunk * 8;
        const bool ok = m0 + row < p.m && k < p.k;
        const uint16_t *src = ok ? p.a + (size_t)(p.a_rows ? p.a_rows[m0 + row] : m0 + row) * p.k + k : p.a;
        cp_async16(a_base + tile_offset(row, chunk) * 2, src, ok);
    }
}

// One stage's products: acc += A tile . W tile^T over the stage's GEMM_BK columns, for the warp
// at (wm, wn). A 16-row fragment wholly past the product's rows (rows_left of the warp's) is
// skipped: its outputs are never stored.
template <class T>
__device__ __forceinline__ void mma_stage(uint32_t a_base, uint32_t w_base, int wm, int wn, int lane, int rows_left,
                                          float (&acc)[T::MI][T::NI][4]) {
    // ldmatrix rows: A, lane l reads row l % 16 of its 16-row tile, chunk l / 16 of the k16 step;
    // W, lane l reads row (l / 16) * 8 + l % 8 of its 16-row pair of n8 tiles, chunk (l / 8) % 2.
    const int a_row = wm * T::WM + lane % 16, a_chunk = lane / 16;
    const int w_row = wn * T::WN + (lane / 16) * 8 + lane % 8, w_chunk = (lane / 8) % 2;
#pragma unroll
    for (int kk = 0; kk < GEMM_BK / 16; ++kk) {
        uint32_t af[T::MI][4], wf[T::NI / 2][4];
#pragma unroll
        for (int i = 0; i < T::MI; ++i)
            if (i * 16 < rows_left) ldmatrix_x4(a_base + tile_offset(a_row + i * 16, kk * 2 + a_chunk) * 2, af[i]);
#pragma unroll
        for (int j = 0; j < T::NI / 2; ++j)
            ldmatrix_x4(w_base + tile_offset(w_row + j * 16, kk * 2 + w_chunk) * 2, wf[j]);
#pragma unroll
        for (int i = 0; i < T::MI; ++i) {
            if (i * 16 >= rows_left) continue;
#pragma unroll
            for (int j = 0; j < T::NI; ++j)
                mma_bf16_16816(acc[i][j], af[i], wf[j / 2][(j % 2) * 2], wf[j / 2][(j % 2) * 2 + 1]);
        }
    }
}

// The block's outputs from acc under epilogue EPI. Thread (lane) holds rows g and g + 8 of each
// 16-row tile, columns 2t and 2t + 1 of each n8.
template <class T, int EPI>
__device__ __forceinline__ void store_tile(const GemmArgs &p, const float (&acc)[T::MI][T::NI][4], int m0, int block_n,
                                           int wm, int wn, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < T::MI; ++i) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = m0 + wm * T::WM + i * 16 + g + half * 8;
            if (row >= p.m) continue;
            if constexpr (EPI == EPI_SWIGLU) {
#pragma unroll
                for (int j = 0; j < T::NI / 2; ++j) {
                    const int col = block_n * (T::BN / 2) + wn * (T::WN / 2) + j * 8 + 2 * t;
                    if (col >= p.n) continue;  // n is even: col + 1 < n too
                    float g0 = acc[i][j][half * 2], g1 = acc[i][j][half * 2 + 1];
                    float u0 = acc[i][j + T::NI / 2][half * 2], u1 = acc[i][j + T::NI / 2][half * 2 + 1];
                    if (p.bias) {
                        g0 += bf16_to_f32(p.bias[col]);
                        g1 += bf16_to_f32(p.bias[col + 1]);
                        u0 += bf16_to_f32(p.bias[p.up_bias + col]);
                        u1 += bf16_to_f32(p.bias[p.up_bias + col + 1]);
                    }
                    *reinterpret_cast<uint32_t *>(p.h + (size_t)row * p.n + col) =
                        pack_bf16x2(glu(g0, u0, p.act), glu(g1, u1, p.act));
                }
            } else {
#pragma unroll
                for (int j = 0; j < T::NI; ++j) {
                    const int col = block_n * T::BN + wn * T::WN + j * 8 + 2 * t;
                    float v0 = acc[i][j][half * 2], v1 = acc[i][j][half * 2 + 1];
                    float *dst = p.c + (size_t)row * p.ldc + col;
                    if (col + 1 < p.n) {
                        if (p.bias) {
                            v0 += bf16_to_f32(p.bias[col]);
                            v1 += bf16_to_f32(p.bias[col + 1]);
                        }
                        if (p.ldc % 2 == 0) {  // 8-byte aligned pair (c is 8-byte aligned)
                            float2 *d2 = reinterpret_cast<float2 *>(dst);
                            if constexpr (EPI == EPI_ACCUMULATE) {
                                const float2 old = *d2;
                                v0 += old.x;
                                v1 += old.y;
                            }
                            *d2 = make_float2(v0, v1);
                        } else {
                            if constexpr (EPI == EPI_ACCUMULATE) {
                                v0 += dst[0];
                                v1 += dst[1];
                            }
                            dst[0] = v0;
                            dst[1] = v1;
                        }
                    } else if (col < p.n) {
                        if (p.bias) v0 += bf16_to_f32(p.bias[col]);
                        if constexpr (EPI == EPI_ACCUMULATE) v0 += dst[0];
                        dst[0] = v0;
                    }
                }
            }
        }
    }
}
