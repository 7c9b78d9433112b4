// launch.cuh -- how libarc's launchers enqueue a kernel: programmatic dependent launch and its
// device side, the launch helper, and ARC_TRY. Each kernel's launcher is its arc_op_* entry point
// (arc_ops.h), which the forwards call too, so the kernel tests exercise exactly what a forward runs.
//
// Every launcher takes the context (it enqueues on ctx->stream), checks its limits with
// ARC_REQUIRE, launches, and checks the launch with ARC_LAUNCHED. Token and position are read
// on the device from the pointers given, never passed by value, so a captured graph replays
// unchanged at every position.
#pragma once

#include "internal.cuh"

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
// attribute on devices of compute capability 9.0 or more (a plain launch elsewhere), in clusters
// of `cluster` blocks when it is not 0, and checks the launch as ARC_LAUNCHED does.
template <typename... Params, typename... Args>
int arc_launch_ex(arc_context *ctx, const char *name, void (*kernel)(Params...), dim3 grid, dim3 block,
                  size_t smem, int cluster, Args... args) {
    cudaLaunchAttribute attrs[2];
    int n = 0;
    if (ctx->cc_major >= 9) {
        attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster) {
        attrs[n].id = cudaLaunchAttributeClusterDimension;
        attrs[n].val.clusterDim.x = cluster;
        attrs[n].val.clusterDim.y = 1;
        attrs[n++].val.clusterDim.z = 1;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ctx->stream;
    cfg.attrs = attrs;
    cfg.numAttrs = n;
    cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
    if (err != cudaSuccess) {
        ctx->counters.kernel_launches++;
        ctx->counters.cuda_calls++;
        cudaGetLastError();  // clear it: the status below reports it
        return arc_fail_cuda(err, name, "cudaLaunchKernelEx");
    }
    ARC_LAUNCHED(ctx, name);
    return ARC_OK;
}

template <typename... Params, typename... Args>
int arc_launch_pdl(arc_context *ctx, const char *name, void (*kernel)(Params...), dim3 grid, dim3 block,
                   size_t smem, Args... args) {
    return arc_launch_ex(ctx, name, kernel, grid, block, smem, 0, args...);
}

// Returns the status of a failed launcher: a forward stops at the first error.
#define ARC_TRY(call)                          \
    do {                                       \
        int arc_st_ = (call);                  \
        if (arc_st_ != ARC_OK) return arc_st_; \
    } while (0)
