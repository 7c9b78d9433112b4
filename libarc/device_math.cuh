// device_math.cuh -- the device arithmetic libarc's kernels share: bf16 conversions, warp and
// block reductions, the GLU's activations, loads that skip L1, and the 8-wide dot product and sum
// of squares the GEMVs and norms add in one order.
#pragma once

#include <math.h>
#include <stdint.h>

#include "internal.cuh"

// bf16 is the top half of a float32: widening is exact.
__device__ __forceinline__ float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }
__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// Round to nearest, ties to even; a NaN stays a quiet NaN (rounding must not carry it into inf).
__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// Sum over the block; every thread gets the same value (each sums the warp partials in the
// same order). Contains __syncthreads: call it from every thread of the block. `scratch` holds
// one float per warp.
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = (blockDim.x + 31) / 32;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by an earlier call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < nwarps; ++w) s += scratch[w];
    return s;
}

__device__ __forceinline__ float block_max(float v, float *scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = (blockDim.x + 31) / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < nwarps; ++w) m = fmaxf(m, scratch[w]);
    return m;
}

// silu(g) = g / (1 + exp(-g)); for very negative g, exp overflows to inf and g / inf = -0.
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }
// GELU, tanh form: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), in float32 (Gemma's GLU).
__device__ __forceinline__ float gelu_tanh(float g) {
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}
// gpt-oss's GLU (ARC_ACT_SWIGLU_LIMIT): g' sigmoid(1.702 g') (u' + 1), g' = min(g, 7), u' = u
// clamped to [-7, 7], in that order of operations (arcpy's reference: clamped_swiglu).
__device__ __forceinline__ float swiglu_limit(float g, float u) {
    const float gc = fminf(g, 7.0f), uc = fminf(fmaxf(u, -7.0f), 7.0f);
    return gc / (1.0f + expf(-1.702f * gc)) * (uc + 1.0f);
}
// The GLU of a gate and an up value under an arc_activation: act(g) * u.
__device__ __forceinline__ float glu(float g, float u, int act) {
    if (act == ARC_ACT_SWIGLU_LIMIT) return swiglu_limit(g, u);
    return (act == ARC_ACT_GELU_TANH ? gelu_tanh(g) : silu(g)) * u;
}

// Global loads that skip L1 (weights stream through once: L1 is better left to what is reused),
// from data no kernel of the step writes (.nc).
__device__ __forceinline__ uint32_t load_nc32(const void *p) {
    uint32_t r;
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ uint32_t load_nc16(const void *p) {
    unsigned short r;
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ uint2 load_nc64(const void *p) {
    uint2 r;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}
__device__ __forceinline__ uint4 load_nc128(const void *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// acc + dot(8 bf16 weights, 8 floats a.xyzw b.xyzw); element 0 is the low half of w.x.
__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b, float acc) {
    acc = fmaf(bf16_lo(w.x), a.x, acc);
    acc = fmaf(bf16_hi(w.x), a.y, acc);
    acc = fmaf(bf16_lo(w.y), a.z, acc);
    acc = fmaf(bf16_hi(w.y), a.w, acc);
    acc = fmaf(bf16_lo(w.z), b.x, acc);
    acc = fmaf(bf16_hi(w.z), b.y, acc);
    acc = fmaf(bf16_lo(w.w), b.z, acc);
    acc = fmaf(bf16_hi(w.w), b.w, acc);
    return acc;
}

// ss plus the squares of 8 inputs a.xyzw b.xyzw, in the order every fused or row norm adds them.
__device__ __forceinline__ float add_sq8(float ss, float4 a, float4 b) {
    ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    ss += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
    return ss;
}
