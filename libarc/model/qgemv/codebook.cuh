// codebook.cuh -- the codebook formats' lookups (MXFP4, IQ4_NL, IQ4_XS; quant.cuh's units): a
// unit's 4-bit codes turned into int8 values by byte permutes.
#pragma once

#include <stdint.h>

#include "internal.cuh"

// prmt: byte n of the result is byte (sel >> 4n) & 7 of a (0..3) then b (4..7), for selectors whose
// bit 4n + 3 is clear (set, it would replicate that byte's sign); sel's upper 16 bits are not read.
__device__ __forceinline__ uint32_t byte_permute(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// A codebook format's table, four int8 values a word (codes 4j..4j+3 in word j, code 4j in its
// low byte): MXFP4's e2m1 values doubled, the IQ4 formats' grid.
template <int F>
struct Codebook {
    static constexpr uint32_t t0 = F == ARC_FORMAT_MXFP4 ? 0x03020100u : 0xBFAD9881u;  // 0, 1, 2, 3 | -127, -104, -83, -65
    static constexpr uint32_t t1 = F == ARC_FORMAT_MXFP4 ? 0x0C080604u : 0xF6EADDCFu;  // 4, 6, 8, 12 | -49, -35, -22, -10
    static constexpr uint32_t t2 = F == ARC_FORMAT_MXFP4 ? 0xFDFEFF00u : 0x26190D01u;  // 0, -1, -2, -3 | 1, 13, 25, 38
    static constexpr uint32_t t3 = F == ARC_FORMAT_MXFP4 ? 0xF4F8FAFCu : 0x71594535u;  // -4, -6, -8, -12 | 53, 69, 89, 113
};

// Word w of a codebook unit (arc.h: the codes of weights 4i..4i+3 in its nibbles 0..3, of
// 16+4i..16+4i+3 in nibbles 4..7) -> their values as int8 bytes, lo and hi (weight 4i + b, 16 +
// 4i + b in byte b). Each half: the codes' low three bits pick a byte among the table's first
// eight values and among its last eight (a permute each), and their fourth bit picks between the two.
template <int F>
__device__ __forceinline__ void codebook_word(uint32_t w, uint32_t &lo, uint32_t &hi) {
    using T = Codebook<F>;
    // a permute reads the low 16 bits of its selector: the upper halves serve the high codes, shifted down
    const uint32_t s = w & 0x77777777u, pick = ((w >> 1) & 0x44444444u) | 0x32103210u;
    lo = byte_permute(byte_permute(T::t0, T::t1, s), byte_permute(T::t2, T::t3, s), pick);
    hi = byte_permute(byte_permute(T::t0, T::t1, s >> 16), byte_permute(T::t2, T::t3, s >> 16), pick >> 16);
}
