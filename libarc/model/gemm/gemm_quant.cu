// gemm_quant.cu -- the prefill's matrix products read straight from packed weights: gemm.cu's
// kernel with the W tile made on chip. Each stage copies the raw bytes of its weight rows (two
// units of 32 a row: quants, high bits, scales) into shared memory by cp.async, as many stages
// ahead as gemm.cu keeps; then the block's threads decode the stage's units to bf16 by
// quant.cuh's decode_unit, the formula arc_op_dequantize rounds, into the swizzled W tile that
// mma_stage reads. So for the same weights the outputs equal, bit for bit, arc_op_dequantize
// followed by arc_op_gemm_bf16 (gemm_tile.cuh: every tile shape sums alike), without writing
// and reading the bf16 matrix: a short prefill reads each packed byte about once.
//
// A pipeline stage is QG sub-stages of 64 columns, so a thread decodes QG independent units
// between two barriers (with one, a 6144-row matrix ran at 223 GB/s for one token: one block an SM,
// each stage a chain of latencies; with two, 247 GB/s and a quarter less time at 72 rows, docs/PERF.md).
// One tile shape, 64 x 64 with 4 warps (gemm.cu's smallest): the products this serves are short
// (arc_model_prefill sends a chunk of up to QUANT_DIRECT_ROWS rows here, longer ones to the bf16
// products over the dequantized matrix), and small tiles put a block on every SM.
#include "gemm_tile.cuh"
#include "model/qgemv/quant.cuh"

using TileQ = GemmTile<64, 64, 2, 2, 3, 2>;
static_assert(TileQ::THREADS == 2 * TileQ::BN, "two threads a weight row, one unit each a sub-stage");
// 64-wide sub-stages a pipeline stage: a thread decodes QG independent units between two barriers.
constexpr int QG = 2;

// Where a stage's raw bytes of one weight row lie in its slot of shared memory (bytes): the two
// units' quants at 0, the high bits at HOFF, the scales at SOFF (Q6_K, Q3_K: their two int8 pairs,
// then the word holding their superblock's d at SOFF + 4; Q2_K: its two scale bytes a unit, then its
// superblock's d and dmin at SOFF + 4; MXFP4, IQ4_XS: the aligned word holding their scale bytes,
// then IQ4_XS's word holding d at SOFF + 4); ROW bytes a row, 16-byte aligned.
template <int F>
struct RawSlot {
    static constexpr int QB = F == ARC_FORMAT_Q8_0 ? 64 : format_two_bit(F) ? 16 : 32;
    static constexpr bool HIGH = format_h32(F) || F == ARC_FORMAT_Q6_K;
    static constexpr int HOFF = QB, SOFF = QB + (HIGH ? 16 : 0);
    static constexpr bool TWO_WORDS = F == ARC_FORMAT_Q4_1 || F == ARC_FORMAT_Q5_1 || F == ARC_FORMAT_Q6_K ||
                                      F == ARC_FORMAT_IQ4_XS || format_two_bit(F);
    static constexpr int SB = F == ARC_FORMAT_Q4_K || F == ARC_FORMAT_Q5_K ? 16 : TWO_WORDS ? 8 : 4;
    static constexpr int ROW = (SOFF + SB + 15) / 16 * 16;
};

template <int F>
constexpr int quant_smem() {
    return QG * (TileQ::STAGES * TileQ::BM * GEMM_BK * 2 + TileQ::BN * GEMM_BK * 2 + TileQ::STAGES * TileQ::BN * RawSlot<F>::ROW);
}

template <int N>
__device__ __forceinline__ void cp_async_small(uint32_t smem, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem), "l"(src), "n"(N));
}

// The raw bytes of units u0 and u0 + 1 of one weight row (row: its first byte, L its layout) into
// slot, half j of the row's two threads: j copies unit u0 + j's quants (where it exists), j = 0
// the high bits, j = 1 the scales.
template <int F>
__device__ __forceinline__ void copy_raw(const uint8_t *row, const RowLayout &L, int u0, int units, int j,
                                         uint32_t slot) {
    using S = RawSlot<F>;
    const int u = u0 + j;
    if (u < units) {
        if constexpr (F == ARC_FORMAT_Q8_0) {
            cp_async16(slot + 32 * j, row + 32 * u, true);
            cp_async16(slot + 32 * j + 16, row + 32 * u + 16, true);
        } else if constexpr (format_two_bit(F)) {
            cp_async_small<8>(slot + 8 * j, row + 8 * u);
        } else {
            cp_async16(slot + 16 * j, row + 16 * u, true);
        }
    }
    if (j == 0) {
        if constexpr (format_h32(F)) cp_async_small<8>(slot + S::HOFF, row + L.b + 4 * u0);
        if constexpr (F == ARC_FORMAT_Q6_K) cp_async16(slot + S::HOFF, row + L.b + 8 * u0, true);
    } else {
        if constexpr (F == ARC_FORMAT_Q8_0 || F == ARC_FORMAT_Q4_0 || F == ARC_FORMAT_Q5_0 || F == ARC_FORMAT_IQ4_NL)
            cp_async_small<4>(slot + S::SOFF, row + L.c + 2 * u0);
        if constexpr (F == ARC_FORMAT_Q4_1 || F == ARC_FORMAT_Q5_1) cp_async_small<8>(slot + S::SOFF, row + L.c + 4 * u0);
        // one scale byte a unit: the aligned word holding both (the C array is padded to 16)
        if constexpr (F == ARC_FORMAT_MXFP4 || F == ARC_FORMAT_IQ4_XS) cp_async_small<4>(slot + S::SOFF, row + L.c + (u0 & ~3));
        if constexpr (F == ARC_FORMAT_IQ4_XS) cp_async_small<4>(slot + S::SOFF + 4, row + L.d + 4 * (u0 / 16));
        if constexpr (F == ARC_FORMAT_Q4_K || F == ARC_FORMAT_Q5_K) cp_async16(slot + S::SOFF, row + L.c + 16 * (u0 / 8), true);
        if constexpr (F == ARC_FORMAT_Q6_K || F == ARC_FORMAT_Q3_K) {
            cp_async_small<4>(slot + S::SOFF, row + L.c + 16 * (u0 / 8) + 2 * (u0 % 8));
            cp_async_small<4>(slot + S::SOFF + 4, row + L.d + 4 * (u0 / 16));  // d arrays are padded to 16
        }
        if constexpr (F == ARC_FORMAT_Q2_K) {
            cp_async_small<4>(slot + S::SOFF, row + L.c + 2 * u0);
            cp_async_small<4>(slot + S::SOFF + 4, row + L.d + 4 * (u0 / 8));
        }
    }
}

// Unit u0 + j of a row's slot as load_unit would have read it from the row.
template <int F>
__device__ __forceinline__ void raw_unit(const uint8_t *slot, int u0, int j, UnitRaw &r) {
    using S = RawSlot<F>;
    if constexpr (F == ARC_FORMAT_Q8_0) {
        r.q0 = *reinterpret_cast<const uint4 *>(slot + 32 * j);
        r.q1 = *reinterpret_cast<const uint4 *>(slot + 32 * j + 16);
    } else if constexpr (format_two_bit(F)) {
        const uint2 q = *reinterpret_cast<const uint2 *>(slot + 8 * j);
        r.q0.x = q.x;
        r.q0.y = q.y;
    } else {
        r.q0 = *reinterpret_cast<const uint4 *>(slot + 16 * j);
    }
    if constexpr (format_h32(F)) r.hb.x = *reinterpret_cast<const uint32_t *>(slot + S::HOFF + 4 * j);
    if constexpr (F == ARC_FORMAT_Q6_K) r.hb = *reinterpret_cast<const uint2 *>(slot + S::HOFF + 8 * j);
    if constexpr (F == ARC_FORMAT_Q8_0 || F == ARC_FORMAT_Q4_0 || F == ARC_FORMAT_Q5_0 || F == ARC_FORMAT_IQ4_NL)
        r.s.x = *reinterpret_cast<const uint16_t *>(slot + S::SOFF + 2 * j);
    if constexpr (F == ARC_FORMAT_Q4_1 || F == ARC_FORMAT_Q5_1) r.s.x = *reinterpret_cast<const uint32_t *>(slot + S::SOFF + 4 * j);
    if constexpr (F == ARC_FORMAT_MXFP4 || F == ARC_FORMAT_IQ4_XS) r.s.x = slot[S::SOFF + (u0 & 3) + j];
    if constexpr (F == ARC_FORMAT_IQ4_XS) r.s.y = *reinterpret_cast<const uint16_t *>(slot + S::SOFF + 4 + 2 * ((u0 / 8) % 2));
    if constexpr (F == ARC_FORMAT_Q4_K || F == ARC_FORMAT_Q5_K) r.s = *reinterpret_cast<const uint4 *>(slot + S::SOFF);
    if constexpr (F == ARC_FORMAT_Q6_K || F == ARC_FORMAT_Q3_K) {
        r.s.x = *reinterpret_cast<const uint16_t *>(slot + S::SOFF + 2 * j);
        r.s.y = *reinterpret_cast<const uint16_t *>(slot + S::SOFF + 4 + 2 * ((u0 / 8) % 2));
    }
    if constexpr (F == ARC_FORMAT_Q2_K) {
        r.s.x = *reinterpret_cast<const uint16_t *>(slot + S::SOFF + 2 * j);
        r.s.y = *reinterpret_cast<const uint32_t *>(slot + S::SOFF + 4);
    }
}

// C tile (blockIdx.x, blockIdx.y) of A W^T over W packed in format F, epilogue EPI; launched as
// gemm.cu's kernel is (grid, M tiles fastest), with quant_smem<F>() bytes of shared memory.
// Grouped (p.offsets): as gemm.cu's kernel.
template <int F, int EPI>
__global__ void __launch_bounds__(TileQ::THREADS, TileQ::MIN_BLOCKS) gemm_quant_kernel(GemmArgs p) {
    using T = TileQ;
    using S = RawSlot<F>;
    extern __shared__ __align__(128) uint16_t smem[];
    // Sub-stage i (stage i / QG) of A at sa + i * BM * GEMM_BK, of the raw bytes at sraw + i * BN * ROW;
    // the W tile of sub-stage g of the current stage at sw + g * BN * GEMM_BK.
    uint16_t *sa = smem, *sw = smem + QG * T::STAGES * T::BM * GEMM_BK;
    uint8_t *sraw = reinterpret_cast<uint8_t *>(sw + QG * T::BN * GEMM_BK);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = warp / T::WARPS_N, wn = warp % T::WARPS_N;
    const int m0 = blockIdx.x * T::BM, block_n = blockIdx.y;
    const int k_tiles = (p.k + GEMM_BK - 1) / GEMM_BK, units = p.k / QUNIT, stages = (k_tiles + QG - 1) / QG;
    const RowLayout L = row_layout(F, p.k);
    // This thread's weight row (the tile's row r) and unit of each stage.
    const int r = tid / 2, j = tid % 2;
    group_weights(p);
    const int wrow = weight_row<T, EPI>(r, block_n, p.n, p.up_rows ? p.up_rows : p.n);
    const uint8_t *row = reinterpret_cast<const uint8_t *>(p.w) + (size_t)(wrow < 0 ? 0 : wrow) * L.bytes;
    const uint32_t raw_base = smem_addr(sraw) + r * S::ROW;

    pdl_launch_dependents();
    pdl_wait();  // A is the previous kernel's output
    if (!group_rows(p, m0)) return;

    auto load = [&](int kt) {
#pragma unroll
        for (int g = 0; g < QG; ++g) {
            const int sub = kt * QG + g, i = (kt % T::STAGES) * QG + g;
            if (sub >= k_tiles) break;
            load_a_stage<T>(p, sa + i * T::BM * GEMM_BK, m0, sub * GEMM_BK, tid);
            if (wrow >= 0) copy_raw<F>(row, L, 2 * sub, units, j, raw_base + i * T::BN * S::ROW);
        }
    };
#pragma unroll
    for (int s = 0; s < T::STAGES - 1; ++s) {
        if (s < stages) load(s);
        cp_async_commit();
    }

    float acc[T::MI][T::NI][4];
#pragma unroll
    for (int i = 0; i < T::MI; ++i)
#pragma unroll
        for (int jn = 0; jn < T::NI; ++jn)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][jn][e] = 0.0f;

    for (int kt = 0; kt < stages; ++kt) {
        cp_async_wait<T::STAGES - 2>();
        __syncthreads();  // stage kt has landed; every warp is done with the W tiles and stage kt - 1
        if (kt + T::STAGES - 1 < stages) load(kt + T::STAGES - 1);
        cp_async_commit();

#pragma unroll
        for (int g = 0; g < QG; ++g) {  // independent units: their decodes overlap
            const int sub = kt * QG + g, i = (kt % T::STAGES) * QG + g, u = 2 * sub + j;
            uint4 *dst = reinterpret_cast<uint4 *>(sw + g * T::BN * GEMM_BK);
            uint4 out[4] = {};
            if (wrow >= 0 && u < units) {
                UnitRaw raw;
                raw_unit<F>(sraw + i * T::BN * S::ROW + r * S::ROW, 2 * sub, j, raw);
                float v[QUNIT];
                decode_unit<F>(raw, u, v);
#pragma unroll
                for (int c = 0; c < 4; ++c)
                    out[c] = make_uint4(pack_bf16x2(v[8 * c], v[8 * c + 1]), pack_bf16x2(v[8 * c + 2], v[8 * c + 3]),
                                        pack_bf16x2(v[8 * c + 4], v[8 * c + 5]), pack_bf16x2(v[8 * c + 6], v[8 * c + 7]));
            }
#pragma unroll
            for (int c = 0; c < 4; ++c) dst[tile_offset(r, 4 * j + c) / 8] = out[c];
        }
        __syncthreads();  // the W tiles are whole

#pragma unroll
        for (int g = 0; g < QG; ++g) {  // k ascending, as gemm.cu sums
            if (kt * QG + g >= k_tiles) break;
            const int i = (kt % T::STAGES) * QG + g;
            mma_stage<T>(smem_addr(sa + i * T::BM * GEMM_BK), smem_addr(sw + g * T::BN * GEMM_BK), wm, wn, lane,
                         p.m - m0 - wm * T::WM, acc);
        }
    }
    cp_async_wait<0>();

    store_tile<T, EPI>(p, acc, m0, block_n, wm, wn, lane);
}

template <int F, int EPI>
static int launch_quant(arc_context *ctx, const GemmArgs &p) {
    auto kernel = gemm_quant_kernel<F, EPI>;
    constexpr int SMEM = quant_smem<F>();
    if (SMEM > 48 * 1024)  // a host-side attribute, legal while capturing
        ARC_CUDA(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    const int n_w = EPI == EPI_SWIGLU ? 2 * p.n : p.n;
    const dim3 grid((p.m + TileQ::BM - 1) / TileQ::BM, (n_w + TileQ::BN - 1) / TileQ::BN, p.offsets ? p.groups : 1);
    return arc_launch_pdl(ctx, "gemm_quant_kernel", kernel, grid, dim3(TileQ::THREADS), (size_t)SMEM, p);
}

template <int F>
static int launch_format(arc_context *ctx, const GemmArgs &p, int epilogue) {
    if (epilogue == EPI_SWIGLU) return launch_quant<F, EPI_SWIGLU>(ctx, p);
    if (epilogue == EPI_ACCUMULATE) return launch_quant<F, EPI_ACCUMULATE>(ctx, p);
    return launch_quant<F, EPI_STORE>(ctx, p);
}

int gemm_quant(arc_context *ctx, const char *who, int32_t format, const GemmArgs &p, int epilogue) {
    ARC_TRY(check_format_shape(who, format, p.k));
    switch (format) {
    case ARC_FORMAT_Q8_0: return launch_format<ARC_FORMAT_Q8_0>(ctx, p, epilogue);
    case ARC_FORMAT_Q4_0: return launch_format<ARC_FORMAT_Q4_0>(ctx, p, epilogue);
    case ARC_FORMAT_Q4_1: return launch_format<ARC_FORMAT_Q4_1>(ctx, p, epilogue);
    case ARC_FORMAT_Q4_K: return launch_format<ARC_FORMAT_Q4_K>(ctx, p, epilogue);
    case ARC_FORMAT_Q5_K: return launch_format<ARC_FORMAT_Q5_K>(ctx, p, epilogue);
    case ARC_FORMAT_Q6_K: return launch_format<ARC_FORMAT_Q6_K>(ctx, p, epilogue);
    case ARC_FORMAT_MXFP4: return launch_format<ARC_FORMAT_MXFP4>(ctx, p, epilogue);
    case ARC_FORMAT_IQ4_NL: return launch_format<ARC_FORMAT_IQ4_NL>(ctx, p, epilogue);
    case ARC_FORMAT_IQ4_XS: return launch_format<ARC_FORMAT_IQ4_XS>(ctx, p, epilogue);
    case ARC_FORMAT_Q5_0: return launch_format<ARC_FORMAT_Q5_0>(ctx, p, epilogue);
    case ARC_FORMAT_Q5_1: return launch_format<ARC_FORMAT_Q5_1>(ctx, p, epilogue);
    case ARC_FORMAT_Q3_K: return launch_format<ARC_FORMAT_Q3_K>(ctx, p, epilogue);
    default: return launch_format<ARC_FORMAT_Q2_K>(ctx, p, epilogue);
    }
}
