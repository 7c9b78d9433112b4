// kernels.cuh -- what the forward's kernels share: bf16 conversions, warp and block reductions,
// and the launch helper. Each kernel's launcher is its arc_op_* entry point, which
// arc_model_forward calls too, so the kernel tests exercise exactly what the forward runs.
//
// Every launcher takes the context (it enqueues on ctx->stream), checks its limits with
// ARC_REQUIRE, launches, and checks the launch with ARC_LAUNCHED. Token and position are read
// on the device from the pointers given, never passed by value, so a captured graph replays
// unchanged at every position.
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

// Programmatic dependent launch (sm_90+). The forward's kernels are launched so that the next
// one may start while this one finishes; each kernel therefore follows one rule: before
// pdl_wait() it reads only what no kernel of the current step writes (weights; and, in the
// attention kernel, the position and the cache rows of earlier positions, written before the
// step began) and writes nothing; everything else that reads or writes activations, the KV
// cache, the token or the position comes after it.
// pdl_wait() returns once every earlier kernel has completed and its writes are visible (at
// once when the kernel was launched without the attribute). pdl_launch_dependents() lets the
// next kernel be scheduled; it grants nothing else.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem, ctx->stream>>>(args...) with the programmatic-serialization
// attribute on devices of compute capability 9.0 or more (a plain launch elsewhere), and checks
// the launch as ARC_LAUNCHED does.
template <typename... Params, typename... Args>
int arc_launch_pdl(arc_context *ctx, const char *name, void (*kernel)(Params...), dim3 grid, dim3 block,
                   size_t smem, Args... args) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ctx->stream;
    cfg.attrs = &attr;
    cfg.numAttrs = ctx->cc_major >= 9 ? 1 : 0;
    cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
    if (err != cudaSuccess) {
        ctx->counters.kernel_launches++;
        ctx->counters.cuda_calls++;
        cudaGetLastError();  // clear it: the status below reports it
        return arc_fail_cuda(err, name, "arc_launch_pdl");
    }
    ARC_LAUNCHED(ctx, name);
    return ARC_OK;
}

// silu(g) = g / (1 + exp(-g)); for very negative g, exp overflows to inf and g / inf = -0.
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// The GEMV stages its input as float32 in shared memory: 192 KiB of it at most.
enum { GEMV_MAX_COLS = 49152 };
// Attention's limits (its chunk of positions per block depends on head_dim: attention.cu).
enum { ATTN_MAX_SEQ = 1 << 20, ATTN_MAX_HEAD_DIM = 128 };

// The launchers are the arc_op_* entry points of arc.h; shapes and limits are documented at
// each kernel. Bytes of scratch arc_op_attention needs for these shapes (0 if invalid).
uint64_t arc_attention_scratch_bytes(int32_t n_heads, int32_t head_dim, int32_t max_seq);
