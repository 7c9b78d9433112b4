// quant.cuh -- the quantized weight formats of arc.h (arc_format): where a row's arrays lie, one
// unit of 32 weights loaded raw, its dot product with the quantized input, and its weights
// decoded to float. qgemv.cu (the decode's products) and dequant.cu (the prefill's) use them.
//
// The dot of a unit is integer work: the quants are unpacked four to a 32-bit word (a nibble,
// plus Q5_K's fifth bit or Q6_K's two high bits, into each byte) and multiplied with four
// int8 inputs by one dp4a; the float scales are applied once per unit. An unpacked byte of
// word i holds weight 4i + b (low nibbles) or 16 + 4i + b (high nibbles), which is why the
// input is kept as eight words: x_q[0..15] in xa, x_q[16..31] in xb. The codebook formats
// (MXFP4, IQ4_NL, IQ4_XS) look their codes up four at a time with byte permutes (codebook_word),
// into int8 words laid out as Q8_0's. The 2-bit formats (Q3_K, Q2_K) hold a unit's quants in two
// words laid out as Q6_K's high bits, four fields of a byte for weights 4i + b, i = 0..3.
#pragma once

#include <cuda_fp16.h>

#include "codebook.cuh"
#include "device_math.cuh"
#include "launch.cuh"

enum { QUNIT = 32, QSUPER = 256 };

// Whether a format is one of the _K formats (superblocks of 256 weights).
__host__ __device__ constexpr bool format_is_k(int f) {
    return f == ARC_FORMAT_Q4_K || f == ARC_FORMAT_Q5_K || f == ARC_FORMAT_Q6_K;
}
// The last arc_format: the quantized ones are ARC_FORMAT_Q8_0..FORMAT_LAST.
constexpr int FORMAT_LAST = ARC_FORMAT_Q2_K;
__host__ __device__ constexpr int format_quantized(int f) { return f >= ARC_FORMAT_Q8_0 && f <= FORMAT_LAST; }
// Whether a format's rows are whole superblocks of 256 weights (the _K formats, IQ4_XS).
// Whether a format's quants are 2 bits a weight in A (Q3_K, Q2_K; Q3_K's third bit in B).
__host__ __device__ constexpr bool format_two_bit(int f) { return f == ARC_FORMAT_Q3_K || f == ARC_FORMAT_Q2_K; }
__host__ __device__ constexpr bool format_super(int f) {
    return format_is_k(f) || format_two_bit(f) || f == ARC_FORMAT_IQ4_XS;
}
// Whether a format's quants are codes into a table of 16 int8 values.
__host__ __device__ constexpr bool format_codebook(int f) {
    return f == ARC_FORMAT_MXFP4 || f == ARC_FORMAT_IQ4_NL || f == ARC_FORMAT_IQ4_XS;
}
// Whether a format holds Q5_K's high-bit word a unit: its fifth bits (Q5_K, Q5_0, Q5_1), or
// Q3_K's third.
__host__ __device__ constexpr bool format_q5(int f) {
    return f == ARC_FORMAT_Q5_K || f == ARC_FORMAT_Q5_0 || f == ARC_FORMAT_Q5_1;
}
__host__ __device__ constexpr bool format_h32(int f) { return format_q5(f) || f == ARC_FORMAT_Q3_K; }

// Byte offsets of a row's arrays B, C and D, and the row's size (arc.h: each array padded to 16).
struct RowLayout {
    uint32_t b, c, d, bytes;
};

__host__ __device__ constexpr uint32_t pad16(uint32_t n) { return (n + 15u) & ~15u; }

// The row layout from the bytes of its arrays, unpadded.
__host__ __device__ inline RowLayout layout_of(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    RowLayout l;
    l.b = pad16(a);
    l.c = l.b + pad16(b);
    l.d = l.c + pad16(c);
    l.bytes = l.d + pad16(d);
    return l;
}

// row_layout of the formats after Q6_K in arc_format.
__host__ __device__ inline RowLayout later_row_layout(int f, int cols) {
    const uint32_t units = (uint32_t)cols / QUNIT, supers = (uint32_t)cols / QSUPER;
    const uint32_t a = units * (format_two_bit(f) ? 8u : 16u);
    const uint32_t b = format_h32(f) ? units * 4u : 0u;
    const uint32_t c = f == ARC_FORMAT_Q5_1                              ? units * 4u
                       : format_two_bit(f)                               ? supers * 16u
                       : f == ARC_FORMAT_MXFP4 || f == ARC_FORMAT_IQ4_XS ? units
                                                                         : units * 2u;
    const uint32_t d = f == ARC_FORMAT_Q2_K                                 ? supers * 4u
                       : f == ARC_FORMAT_IQ4_XS || f == ARC_FORMAT_Q3_K ? supers * 2u
                                                                        : 0u;
    return layout_of(a, b, c, d);
}

__host__ __device__ inline RowLayout row_layout(int f, int cols) {
    if (f > ARC_FORMAT_Q6_K) return later_row_layout(f, cols);
    const uint32_t units = (uint32_t)cols / QUNIT, supers = (uint32_t)cols / QSUPER;
    const uint32_t a = units * (f == ARC_FORMAT_Q8_0 ? 32u : 16u);
    const uint32_t b = f == ARC_FORMAT_Q5_K ? units * 4u : f == ARC_FORMAT_Q6_K ? units * 8u : 0u;
    const uint32_t c = f == ARC_FORMAT_Q4_1 ? units * 4u : format_is_k(f) ? supers * 16u : units * 2u;
    const uint32_t d = f == ARC_FORMAT_Q6_K ? supers * 2u : 0u;
    return layout_of(a, b, c, d);
}

// The raw bytes of one unit: its quants (q1 for Q8_0's second half), its high bits (hb), and
// the scale words it needs (s: Q4_0, Q8_0, Q5_0, IQ4_NL d in s.x; Q4_1, Q5_1 d | m << 16 in s.x;
// _K(4, 5): the superblock's 16 bytes; Q6_K its two scales in s.x, d in s.y; MXFP4 e in s.x;
// IQ4_XS its scale byte in s.x, d in s.y; Q3_K as Q6_K; Q2_K its two scale bytes in s.x, d | dmin << 16
// in s.y; Q3_K, Q2_K: the quants in q0.x, q0.y).
struct UnitRaw {
    uint4 q0, q1;
    uint2 hb;
    uint4 s;
};

// Unit u of the row at `row` (format F, layout L), in two parts: its quants (the bulk of its
// bytes), then the rest (high bits and scales). Every load issued, none used.
template <int F>
__device__ __forceinline__ void load_quants(const uint8_t *row, int u, UnitRaw &r) {
    if constexpr (F == ARC_FORMAT_Q8_0) {
        r.q0 = load_nc128(row + 32 * u);
        r.q1 = load_nc128(row + 32 * u + 16);
    } else if constexpr (format_two_bit(F)) {
        const uint2 q = load_nc64(row + 8 * u);
        r.q0.x = q.x;
        r.q0.y = q.y;
    } else {
        r.q0 = load_nc128(row + 16 * u);
    }
}

// A byte, as load_nc16 loads a word.
__device__ __forceinline__ uint32_t load_nc8(const void *p) {
    unsigned short r;
    asm("ld.global.nc.L1::no_allocate.u8 %0, [%1];" : "=h"(r) : "l"(p));
    return r;
}

template <int F>
__device__ __forceinline__ void load_rest(const uint8_t *row, const RowLayout &L, int u, UnitRaw &r) {
    if constexpr (format_h32(F)) r.hb.x = load_nc32(row + L.b + 4 * u);
    if constexpr (F == ARC_FORMAT_Q6_K) r.hb = load_nc64(row + L.b + 8 * u);
    if constexpr (F == ARC_FORMAT_Q8_0 || F == ARC_FORMAT_Q4_0 || F == ARC_FORMAT_Q5_0 || F == ARC_FORMAT_IQ4_NL)
        r.s.x = load_nc16(row + L.c + 2 * u);
    if constexpr (F == ARC_FORMAT_Q4_1 || F == ARC_FORMAT_Q5_1) r.s.x = load_nc32(row + L.c + 4 * u);
    if constexpr (F == ARC_FORMAT_MXFP4 || F == ARC_FORMAT_IQ4_XS) r.s.x = load_nc8(row + L.c + u);
    if constexpr (F == ARC_FORMAT_IQ4_XS) r.s.y = load_nc16(row + L.d + 2 * (u / 8));
    if constexpr (F == ARC_FORMAT_Q4_K || F == ARC_FORMAT_Q5_K) r.s = load_nc128(row + L.c + 16 * (u / 8));
    if constexpr (F == ARC_FORMAT_Q6_K || F == ARC_FORMAT_Q3_K) {
        r.s.x = load_nc16(row + L.c + 16 * (u / 8) + 2 * (u % 8));
        r.s.y = load_nc16(row + L.d + 2 * (u / 8));
    }
    if constexpr (F == ARC_FORMAT_Q2_K) {
        r.s.x = load_nc16(row + L.c + 2 * u);
        r.s.y = load_nc32(row + L.d + 4 * (u / 8));
    }
}

template <int F>
__device__ __forceinline__ void load_unit(const uint8_t *row, const RowLayout &L, int u, UnitRaw &r) {
    load_quants<F>(row, u, r);
    load_rest<F>(row, L, u, r);
}

__device__ __forceinline__ float half_lo(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w & 0xffffu))); }
__device__ __forceinline__ float half_hi(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w >> 16))); }

// Word i (0..3) of a 4-bit unit unpacked: the low nibbles (weights 4i..4i+3) and the high ones
// (16 + 4i..), each in the low bits of a byte, with the high bits of Q5_K and Q6_K put above.
template <int F>
__device__ __forceinline__ void unpack_word(const UnitRaw &r, int i, uint32_t w, uint32_t &lo, uint32_t &hi) {
    lo = w & 0x0f0f0f0fu;
    hi = (w >> 4) & 0x0f0f0f0fu;
    if constexpr (format_q5(F)) {
        lo |= ((r.hb.x >> i) & 0x01010101u) << 4;
        hi |= ((r.hb.x >> (4 + i)) & 0x01010101u) << 4;
    }
    if constexpr (F == ARC_FORMAT_Q6_K) {
        lo |= ((r.hb.x >> (2 * i)) & 0x03030303u) << 4;
        hi |= ((r.hb.y >> (2 * i)) & 0x03030303u) << 4;
    }
}

// A codebook unit's float scale: MXFP4 2^(e - 128) (a subnormal for e < 2), IQ4_NL d, IQ4_XS d * s
// (exact: an f16 times a 6-bit integer).
template <int F>
__device__ __forceinline__ float codebook_scale(const UnitRaw &r) {
    if constexpr (F == ARC_FORMAT_MXFP4) {
        const uint32_t e = r.s.x & 0xffu;
        return __uint_as_float(e >= 2u ? (e - 1u) << 23 : 0x00200000u << e);
    } else if constexpr (F == ARC_FORMAT_IQ4_NL) {
        return half_lo(r.s.x);
    } else {
        return __fmul_rn(half_lo(r.s.y), (float)(int8_t)(r.s.x & 0xffu));
    }
}

// The quantized input of one unit: its 32 int8 values as eight words, its scale dx and the sums
// of its first and last 16 values.
struct UnitInput {
    int4 xa, xb;
    float dx;
    int s0, s1;
};

// Where unit j (0..7) of a _K superblock finds its 6-bit scale and min among the 12 scale bytes
// that follow d and dmin (s.y, s.z, s.w), as GGUF's get_scale_min_k4 reads them: the scale is
// ((y >> sh) & my) | ((w >> tw) & 0xf), the min the same with z and (w >> tw) >> 4; for j < 4
// sh = 8j, my = 63 and tw = 32 (the w term shifted out), else sh = 8(j - 4) + 2, my = 0x30 and
// tw = 8(j - 4). Decoded once a lane: all of a lane's units have the same j (qgemv.cuh).
struct KSlot {
    uint32_t sh, my, tw;
};

__device__ __forceinline__ KSlot k_slot(int j) {
    const uint32_t t = 8u * (uint32_t)(j & 3);
    return j < 4 ? KSlot{t, 63u, 32u} : KSlot{t + 2u, 0x30u, t};
}

// The scale and min of the unit at k of the superblock whose 16 bytes are s.
__device__ __forceinline__ void k_scale_min(const uint4 &s, const KSlot &k, int &sc, int &m) {
    const uint32_t wt = __funnelshift_rc(s.w, 0u, k.tw);
    sc = (int)(((s.y >> k.sh) & k.my) | (wt & 0xfu));
    m = (int)(((s.z >> k.sh) & k.my) | ((wt >> 4) & 0xfu));
}

// dp4a with a's bytes unsigned (they reach 0xf0 below) and b's signed.
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// The byte `sel` picks of w, sign-extended (prmt's sign-replicating selectors 0x8880, 0x9991).
__device__ __forceinline__ int prmt_sext(uint32_t w, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(d) : "r"(w), "r"(sel));
    return (int)d;
}

// Word i (0..3) of a 2-bit unit unpacked as unpack_word's: the quants of weights 4i..4i+3 (lo) and
// 16 + 4i.. (hi), one a byte, with Q3_K's third bit put above.
template <int F>
__device__ __forceinline__ void unpack_two_bit(const UnitRaw &r, int i, uint32_t &lo, uint32_t &hi) {
    lo = (r.q0.x >> (2 * i)) & 0x03030303u;
    hi = (r.q0.y >> (2 * i)) & 0x03030303u;
    if constexpr (F == ARC_FORMAT_Q3_K) {
        lo |= ((r.hb.x >> i) & 0x01010101u) << 2;
        hi |= ((r.hb.x >> (4 + i)) & 0x01010101u) << 2;
    }
}

// A unit's weights as its dot reads them, decoded once for any number of inputs: lo[i] and hi[i]
// the words that meet input words xa[i] and xb[i] (Q8_0: q0's and q1's words; the codebook
// formats: their values, as Q8_0's; the 4-bit formats: the low nibbles, and the high ones in
// place, times 16; Q5_K, Q5_0, Q5_1, Q6_K: the low and high quants with their high bits), and the
// scales: a and b (Q6_K, Q3_K: a, and the halves' int8 scales sa and sb; Q2_K: a = d, b = dmin, and
// each half's scale | min << 16 in sa and sb).
struct UnitW {
    uint32_t lo[4], hi[4];
    float a, b;
    int sa, sb;
};

template <int F>
__device__ __forceinline__ UnitW unit_weights(const UnitRaw &r, const KSlot &k) {
    UnitW w;
    const uint32_t q[4] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w};
    if constexpr (F == ARC_FORMAT_Q8_0) {
        const uint32_t q1[4] = {r.q1.x, r.q1.y, r.q1.z, r.q1.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w.lo[i] = q[i];
            w.hi[i] = q1[i];
        }
    } else if constexpr (format_codebook(F)) {
#pragma unroll
        for (int i = 0; i < 4; ++i) codebook_word<F>(q[i], w.lo[i], w.hi[i]);
    } else if constexpr (format_two_bit(F)) {
#pragma unroll
        for (int i = 0; i < 4; ++i) unpack_two_bit<F>(r, i, w.lo[i], w.hi[i]);
    } else if constexpr (F == ARC_FORMAT_Q4_0 || F == ARC_FORMAT_Q4_1 || F == ARC_FORMAT_Q4_K) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w.lo[i] = q[i] & 0x0f0f0f0fu;
            w.hi[i] = q[i] & 0xf0f0f0f0u;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) unpack_word<F>(r, i, q[i], w.lo[i], w.hi[i]);
    }
    if constexpr (F == ARC_FORMAT_Q4_K || F == ARC_FORMAT_Q5_K) {
        int sc, m;
        k_scale_min(r.s, k, sc, m);
        w.a = __fmul_rn(half_lo(r.s.x), (float)sc);
        w.b = __fmul_rn(half_hi(r.s.x), (float)m);
    } else if constexpr (F == ARC_FORMAT_Q6_K || F == ARC_FORMAT_Q3_K) {
        w.a = half_lo(r.s.y);
        w.sa = prmt_sext(r.s.x, 0x8880u);
        w.sb = prmt_sext(r.s.x, 0x9991u);
    } else if constexpr (F == ARC_FORMAT_Q2_K) {
        w.a = half_lo(r.s.y);
        w.b = half_hi(r.s.y);
        w.sa = (int)((r.s.x & 0xfu) | ((r.s.x & 0xf0u) << 12));
        w.sb = (int)(((r.s.x >> 8) & 0xfu) | ((r.s.x & 0xf000u) << 4));
    } else if constexpr (format_codebook(F)) {
        w.a = codebook_scale<F>(r);
    } else {
        w.a = half_lo(r.s.x);
        w.b = half_hi(r.s.x);  // Q4_1's, Q5_1's min
    }
    return w;
}

// c + the sum over a 4-bit unit of weight times input (Q4_0, Q4_1, Q4_K): the high nibbles are
// multiplied in place, as 16 times their value (bytes up to 0xf0, hence unsigned), in a chain
// started at 16c whose sum, a multiple of 16, is shifted down exactly before the low nibbles
// join it. One mask per word instead of a shift and a mask for the high nibbles.
__device__ __forceinline__ int q4_sum(const UnitW &w, const UnitInput &x, int c) {
    int h = dp4a_us(w.hi[0], x.xb.x, 16 * c);
    h = dp4a_us(w.hi[1], x.xb.y, h);
    h = dp4a_us(w.hi[2], x.xb.z, h);
    h = dp4a_us(w.hi[3], x.xb.w, h);
    int s = __dp4a((int)w.lo[0], x.xa.x, h >> 4);
    s = __dp4a((int)w.lo[1], x.xa.y, s);
    s = __dp4a((int)w.lo[2], x.xa.z, s);
    return __dp4a((int)w.lo[3], x.xa.w, s);
}

// scale * dx * n, each product rounded on its own (never fused into an add).
__device__ __forceinline__ float scaled(float scale, float dx, int n) { return __fmul_rn(__fmul_rn(scale, dx), (float)n); }

// dot(a unit's weights, its input), as arc.h defines it: exact integer sums, then the scales. The
// integer sums are those of the plain formula, only grouped differently (a chain may start at the
// term it is added to). Every float operation is rounded on its own (__fmul_rn, __fadd_rn), so no
// kernel that inlines this can fuse a product into an add differently from another: the decode's
// GEMV and the verify's rows GEMV give the same bits.
template <int F>
__device__ __forceinline__ float dot_w(const UnitW &w, const UnitInput &x) {
    if constexpr (F == ARC_FORMAT_Q8_0 || format_codebook(F)) {
        int acc = __dp4a((int)w.lo[0], x.xa.x, 0);
        acc = __dp4a((int)w.lo[1], x.xa.y, acc);
        acc = __dp4a((int)w.lo[2], x.xa.z, acc);
        acc = __dp4a((int)w.lo[3], x.xa.w, acc);
        acc = __dp4a((int)w.hi[0], x.xb.x, acc);
        acc = __dp4a((int)w.hi[1], x.xb.y, acc);
        acc = __dp4a((int)w.hi[2], x.xb.z, acc);
        acc = __dp4a((int)w.hi[3], x.xb.w, acc);
        return scaled(w.a, x.dx, acc);
    } else if constexpr (F == ARC_FORMAT_Q4_0) {  // slo + shi - 8 * (s0 + s1)
        return scaled(w.a, x.dx, q4_sum(w, x, -8 * (x.s0 + x.s1)));
    } else if constexpr (F == ARC_FORMAT_Q4_1) {  // slo + shi
        return __fadd_rn(scaled(w.a, x.dx, q4_sum(w, x, 0)), scaled(w.b, x.dx, x.s0 + x.s1));
    } else if constexpr (F == ARC_FORMAT_Q4_K) {  // slo + shi
        return __fsub_rn(scaled(w.a, x.dx, q4_sum(w, x, 0)), scaled(w.b, x.dx, x.s0 + x.s1));
    } else {
        const int xa[4] = {x.xa.x, x.xa.y, x.xa.z, x.xa.w}, xb[4] = {x.xb.x, x.xb.y, x.xb.z, x.xb.w};
        // Q6_K, Q5_0, Q3_K: slo - z * s0 and shi - z * s1 (z = 32, 16, 4), each chain started at its offset
        constexpr int z = F == ARC_FORMAT_Q6_K ? 32 : F == ARC_FORMAT_Q5_0 ? 16 : F == ARC_FORMAT_Q3_K ? 4 : 0;
        int slo = z ? -z * x.s0 : 0, shi = z ? -z * x.s1 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            slo = __dp4a((int)w.lo[i], xa[i], slo);
            shi = __dp4a((int)w.hi[i], xb[i], shi);
        }
        if constexpr (F == ARC_FORMAT_Q6_K || F == ARC_FORMAT_Q3_K) return scaled(w.a, x.dx, w.sa * slo + w.sb * shi);
        else if constexpr (F == ARC_FORMAT_Q2_K)
            return __fsub_rn(scaled(w.a, x.dx, (w.sa & 0xffff) * slo + (w.sb & 0xffff) * shi),
                             scaled(w.b, x.dx, (w.sa >> 16) * x.s0 + (w.sb >> 16) * x.s1));
        else if constexpr (F == ARC_FORMAT_Q5_0) return scaled(w.a, x.dx, slo + shi);
        else if constexpr (F == ARC_FORMAT_Q5_1)
            return __fadd_rn(scaled(w.a, x.dx, slo + shi), scaled(w.b, x.dx, x.s0 + x.s1));
        else return __fsub_rn(scaled(w.a, x.dx, slo + shi), scaled(w.b, x.dx, x.s0 + x.s1));  // Q5_K
    }
}

// dot(a unit's weights, its input) from its raw bytes (k: its place in the superblock, _K formats).
template <int F>
__device__ __forceinline__ float dot_unit(const UnitRaw &r, const KSlot &k, const UnitInput &x) {
    return dot_w<F>(unit_weights<F>(r, k), x);
}

// The 32 weights of unit u as floats, by arc.h's formulas: w[k] is weight 32u + k.
template <int F>
__device__ __forceinline__ void decode_unit(const UnitRaw &r, int u, float (&out)[QUNIT]) {
    if constexpr (F == ARC_FORMAT_Q8_0) {
        const float d = half_lo(r.s.x);
        const uint32_t w[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
#pragma unroll
        for (int k = 0; k < QUNIT; ++k) out[k] = d * (float)(int8_t)((w[k / 4] >> (8 * (k % 4))) & 0xffu);
    } else if constexpr (format_two_bit(F)) {
        // Q3_K (d * scale) * (q - 4); Q2_K (d * sc) * q - dmin * m, a scale (and min) each half
        const float d = half_lo(r.s.y);
        float scale_lo, scale_hi, off_lo = 0.0f, off_hi = 0.0f;
        if constexpr (F == ARC_FORMAT_Q3_K) {
            scale_lo = d * (float)(int8_t)(r.s.x & 0xffu);
            scale_hi = d * (float)(int8_t)((r.s.x >> 8) & 0xffu);
        } else {
            scale_lo = d * (float)(r.s.x & 0xfu);
            scale_hi = d * (float)((r.s.x >> 8) & 0xfu);
            off_lo = half_hi(r.s.y) * (float)((r.s.x >> 4) & 0xfu);
            off_hi = half_hi(r.s.y) * (float)((r.s.x >> 12) & 0xfu);
        }
        constexpr int zero = F == ARC_FORMAT_Q3_K ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t lo, hi;
            unpack_two_bit<F>(r, i, lo, hi);
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                out[4 * i + b] = scale_lo * (float)((int)((lo >> (8 * b)) & 0xffu) - zero) - off_lo;
                out[16 + 4 * i + b] = scale_hi * (float)((int)((hi >> (8 * b)) & 0xffu) - zero) - off_hi;
            }
        }
    } else if constexpr (format_codebook(F)) {
        const float a = codebook_scale<F>(r);
        const uint32_t q[4] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t lo, hi;
            codebook_word<F>(q[i], lo, hi);
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                out[4 * i + b] = a * (float)(int8_t)((lo >> (8 * b)) & 0xffu);
                out[16 + 4 * i + b] = a * (float)(int8_t)((hi >> (8 * b)) & 0xffu);
            }
        }
    } else {
        const uint32_t w[4] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w};
        // weight = scale * (q - zero) - off, each format's formula in its own order
        float scale_lo, scale_hi, off_lo = 0.0f, off_hi = 0.0f;
        int zero = 0;
        if constexpr (F == ARC_FORMAT_Q4_0 || F == ARC_FORMAT_Q5_0) {
            scale_lo = scale_hi = half_lo(r.s.x);
            zero = F == ARC_FORMAT_Q4_0 ? 8 : 16;
        } else if constexpr (F == ARC_FORMAT_Q4_1 || F == ARC_FORMAT_Q5_1) {
            scale_lo = scale_hi = half_lo(r.s.x);
            off_lo = off_hi = -half_hi(r.s.x);
        } else if constexpr (F == ARC_FORMAT_Q6_K) {
            const float d = half_lo(r.s.y);
            scale_lo = d * (float)(int8_t)(r.s.x & 0xffu);
            scale_hi = d * (float)(int8_t)((r.s.x >> 8) & 0xffu);
            zero = 32;
        } else {
            int sc, m;
            k_scale_min(r.s, k_slot(u % 8), sc, m);
            scale_lo = scale_hi = half_lo(r.s.x) * (float)sc;
            off_lo = off_hi = half_hi(r.s.x) * (float)m;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t lo, hi;
            unpack_word<F>(r, i, w[i], lo, hi);
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                out[4 * i + b] = scale_lo * (float)((int)((lo >> (8 * b)) & 0xffu) - zero) - off_lo;
                out[16 + 4 * i + b] = scale_hi * (float)((int)((hi >> (8 * b)) & 0xffu) - zero) - off_hi;
            }
        }
    }
}

// ARC_OK where `format` is quantized and cols a positive multiple of its unit; else one error line
// naming `who` (quant.cu).
int check_format_shape(const char *who, int32_t format, int32_t cols);
