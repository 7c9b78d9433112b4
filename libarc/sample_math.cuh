// sample_math.cuh -- the arithmetic of the draw's definition that the host repeats bit for bit
// (arcpy/sampling.py): the Philox word of a position, exp32, and the logits' order keys.
#pragma once

#include <stdint.h>

// Word 0 of Philox4x32-10 (Salmon et al., SC'11) with counter (position, 0, 0, 0) and key seed.
__device__ __forceinline__ uint32_t philox_word0(uint64_t position, uint64_t seed) {
    uint32_t c0 = (uint32_t)position, c1 = (uint32_t)(position >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    return c0;
}

// e^x for x <= 0 from float32 multiplies and adds alone, each rounded on its own (the _rn
// intrinsics are never fused), so the host computes the same bits (arcpy.sampling.exp32): 0 below
// -29, where every weight rounds to 0; else x = n ln2 + r and e^r by its degree-6 Taylor
// polynomial, times 2^n.
__device__ __forceinline__ float exp32(float x) {
    if (x < -29.0f) return 0.0f;
    float n = rintf(__fmul_rn(x, 0x1.715476p+0f));                          // log2(e)
    float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0x1.62e4p-1f)), __fmul_rn(n, 0x1.7f7d1cp-20f));  // ln 2
    float p = 0x1.6c16c2p-10f;                                              // 1/720
    p = __fadd_rn(__fmul_rn(p, r), 0x1.111112p-7f);                         // 1/120
    p = __fadd_rn(__fmul_rn(p, r), 0x1.555556p-5f);                         // 1/24
    p = __fadd_rn(__fmul_rn(p, r), 0x1.555556p-3f);                         // 1/6
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    return __fmul_rn(p, __int_as_float((127 + (int)n) << 23));
}

// An unsigned key in the floats' order (for numbers; -0 is made +0 before).
__device__ __forceinline__ uint32_t order_key(float v) {
    uint32_t b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The key of a logit: order_key, with -0 made +0 and NaN above every number (all NaNs alike).
__device__ __forceinline__ uint32_t value_key(float v) {
    return v != v ? 0xffffffffu : order_key(v == 0.0f ? 0.0f : v);
}

__device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
