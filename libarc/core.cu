// core.cu -- status strings, the per-thread error record, the context (one device, one
// non-blocking stream), memory, and the non-blocking stream query.
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.cuh"

enum { ARC_ABI_VERSION = 18 };

static thread_local char t_last_error[1024];

int arc_fail(int status, const char *what, const char *fmt, ...) {
    int n = snprintf(t_last_error, sizeof t_last_error, "%s: ", what);
    if (n < 0 || n >= (int)sizeof t_last_error) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_last_error + n, sizeof t_last_error - n, fmt, ap);
    va_end(ap);
    return status;
}

// Errors after which the context cannot be used again: the process must be restarted.
static bool is_sticky(cudaError_t err) {
    switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
        return true;
    default:
        return false;
    }
}

static int status_of(cudaError_t err) {
    switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
        return ARC_NO_DEVICE;
    case cudaErrorMemoryAllocation:
        return ARC_OUT_OF_MEMORY;
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorStreamCaptureWrongThread:
    case cudaErrorCapturedEvent:
        return ARC_CAPTURE_ERROR;
    default:
        return is_sticky(err) ? ARC_DEVICE_FAULT : ARC_CUDA_ERROR;
    }
}

int arc_fail_cuda(cudaError_t err, const char *call, const char *where) {
    return arc_fail(status_of(err), where, "%s failed: %s (%s)", call, cudaGetErrorName(err),
                    cudaGetErrorString(err));
}

extern "C" int arc_abi_version(void) { return ARC_ABI_VERSION; }

extern "C" const char *arc_status_string(int status) {
    switch (status) {
    case ARC_OK: return "ok";
    case ARC_NOT_READY: return "not ready";
    case ARC_INVALID_ARGUMENT: return "invalid argument";
    case ARC_NO_DEVICE: return "no CUDA device";
    case ARC_CUDA_ERROR: return "CUDA error";
    case ARC_DEVICE_FAULT: return "device fault";
    case ARC_OUT_OF_MEMORY: return "out of memory";
    case ARC_CAPTURE_ERROR: return "graph capture error";
    case ARC_BUSY: return "stream busy";
    default: return "unknown status";
    }
}

extern "C" const char *arc_last_error(void) { return t_last_error; }

extern "C" int arc_device_count(int *count) {
    ARC_REQUIRE(count, "count is null");
    *count = 0;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err == cudaErrorNoDevice) return ARC_OK;  // a driver without devices: zero, not an error
    if (err == cudaErrorInsufficientDriver) {
        // The runtime says the same when there is no driver at all; tell the two apart.
        void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!driver)
            return arc_fail(ARC_NO_DEVICE, __func__,
                            "no NVIDIA driver is installed (libcuda.so.1 cannot be loaded)");
        dlclose(driver);
        return arc_fail(ARC_NO_DEVICE, __func__,
                        "the NVIDIA driver is older than CUDA 13 needs (driver 580 or newer)");
    }
    if (err != cudaSuccess) return arc_fail_cuda(err, "cudaGetDeviceCount", __func__);
    *count = n;
    return ARC_OK;
}

static void context_release(arc_context *ctx) {
    if (ctx->argmax_vals) cudaFree(ctx->argmax_vals);
    if (ctx->argmax_idx) cudaFree(ctx->argmax_idx);
    if (ctx->argmax_low) cudaFree(ctx->argmax_low);
    if (ctx->argmax_done) cudaFree(ctx->argmax_done);
    if (ctx->head_argmax) cudaFree(ctx->head_argmax);
    if (ctx->attn_done) cudaFree(ctx->attn_done);
    if (ctx->handoff) cudaFree(ctx->handoff);
    if (ctx->handoff_done) cudaFree(ctx->handoff_done);
    if (ctx->draw) cudaFree(ctx->draw);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    free(ctx);
}

// Allocates what a context owns; on failure the caller releases the partial context.
static int context_init(arc_context *ctx, int device) {
    ARC_CUDA(ctx, cudaSetDevice(device));
    ARC_CUDA(ctx, cudaDeviceGetAttribute(&ctx->sm_count, cudaDevAttrMultiProcessorCount, device));
    ARC_CUDA(ctx, cudaDeviceGetAttribute(&ctx->cc_major, cudaDevAttrComputeCapabilityMajor, device));
    ARC_CUDA(ctx, cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    ARC_CUDA(ctx, cudaMalloc(&ctx->argmax_vals, ARGMAX_MAX_BLOCKS * sizeof(float)));
    ARC_CUDA(ctx, cudaMalloc(&ctx->argmax_idx, ARGMAX_MAX_BLOCKS * sizeof(int32_t)));
    ARC_CUDA(ctx, cudaMalloc(&ctx->argmax_low, ARGMAX_MAX_BLOCKS * sizeof(uint32_t)));
    ARC_CUDA(ctx, cudaMalloc(&ctx->argmax_done, sizeof(uint32_t)));
    ARC_CUDA(ctx, cudaMemsetAsync(ctx->argmax_done, 0, sizeof(uint32_t), ctx->stream));
    ARC_CUDA(ctx, cudaMalloc(&ctx->head_argmax, sizeof(HeadArgmax)));
    ARC_CUDA(ctx, cudaMemsetAsync(ctx->head_argmax, 0, sizeof(HeadArgmax), ctx->stream));
    ARC_CUDA(ctx, cudaMalloc(&ctx->attn_done, ARC_ATTN_MAX_GROUPS * sizeof(uint32_t)));
    ARC_CUDA(ctx, cudaMemsetAsync(ctx->attn_done, 0, ARC_ATTN_MAX_GROUPS * sizeof(uint32_t), ctx->stream));
    ARC_CUDA(ctx, cudaMalloc(&ctx->handoff, (size_t)ARC_HANDOFF_UNITS * ARC_HANDOFF_UNIT_BYTES));
    ARC_CUDA(ctx, cudaMalloc(&ctx->handoff_done, ARC_HANDOFF_UNITS * sizeof(uint32_t)));
    ARC_CUDA(ctx, cudaMemsetAsync(ctx->handoff_done, 0, ARC_HANDOFF_UNITS * sizeof(uint32_t), ctx->stream));
    ARC_CUDA(ctx, cudaMalloc(&ctx->draw, sizeof(DrawScratch)));
    ARC_CUDA(ctx, cudaMemsetAsync(ctx->draw, 0, sizeof(DrawScratch), ctx->stream));
    return arc_draw_init(ctx);
}

extern "C" int arc_context_create(int device, arc_context **out) {
    ARC_REQUIRE(out, "out is null");
    *out = nullptr;
    int n = 0;
    int st = arc_device_count(&n);
    if (st != ARC_OK) return st;
    if (n == 0) return arc_fail(ARC_NO_DEVICE, __func__, "no CUDA device is visible");
    if (device < 0 || device >= n)
        return arc_fail(ARC_NO_DEVICE, __func__, "device %d does not exist (%d visible)", device, n);
    arc_context *ctx = (arc_context *)calloc(1, sizeof *ctx);
    if (!ctx) return arc_fail(ARC_OUT_OF_MEMORY, __func__, "host allocation failed");
    ctx->device = device;
    st = context_init(ctx, device);
    if (st != ARC_OK) {
        context_release(ctx);
        return st;
    }
    *out = ctx;
    return ARC_OK;
}

// Frees the context's memory and stream. cudaFree waits for work that may still use the memory:
// teardown, never the step path.
extern "C" int arc_context_destroy(arc_context *ctx) {
    ARC_REQUIRE(ctx, "ctx is null");
    context_release(ctx);
    return ARC_OK;
}

extern "C" int arc_context_device_name(arc_context *ctx, char *buf, size_t len) {
    ARC_REQUIRE(ctx && buf && len > 0, "null argument");
    cudaDeviceProp prop;
    ARC_CUDA(ctx, cudaGetDeviceProperties(&prop, ctx->device));
    snprintf(buf, len, "%s", prop.name);
    return ARC_OK;
}

// Start-up only: what the device has free and in all, for the report of what a model takes.
extern "C" int arc_context_memory(arc_context *ctx, uint64_t *free_bytes, uint64_t *total_bytes) {
    ARC_REQUIRE(ctx && free_bytes && total_bytes, "null argument");
    size_t f = 0, t = 0;
    ARC_CUDA(ctx, cudaMemGetInfo(&f, &t));
    *free_bytes = f;
    *total_bytes = t;
    return ARC_OK;
}

extern "C" int arc_context_counters(arc_context *ctx, arc_counters *out) {
    ARC_REQUIRE(ctx && out, "null argument");
    *out = ctx->counters;
    return ARC_OK;
}

// Never blocks. cudaStreamQuery also returns errors of earlier asynchronous work on the
// device, which is how a sticky fault inside a graph reaches the host without a sync.
extern "C" int arc_stream_query(arc_context *ctx) {
    ARC_REQUIRE(ctx, "ctx is null");
    ctx->counters.cuda_calls++;
    ctx->counters.stream_queries++;
    cudaError_t err = cudaStreamQuery(ctx->stream);
    if (err == cudaSuccess) return ARC_OK;
    if (err == cudaErrorNotReady) return ARC_NOT_READY;
    return arc_fail_cuda(err, "cudaStreamQuery", __func__);
}

extern "C" int arc_device_alloc(arc_context *ctx, uint64_t bytes, void **out) {
    ARC_REQUIRE(ctx && out, "null argument");
    ARC_REQUIRE(bytes > 0, "zero-byte allocation");
    *out = nullptr;
    ARC_CUDA(ctx, cudaMalloc(out, bytes));
    return ARC_OK;
}

extern "C" int arc_device_free(arc_context *ctx, void *ptr) {
    ARC_REQUIRE(ctx, "ctx is null");
    ARC_CUDA(ctx, cudaFree(ptr));
    return ARC_OK;
}

extern "C" int arc_host_alloc(arc_context *ctx, uint64_t bytes, void **host_out, void **device_out) {
    ARC_REQUIRE(ctx && host_out && device_out, "null argument");
    ARC_REQUIRE(bytes > 0, "zero-byte allocation");
    *host_out = *device_out = nullptr;
    void *h = nullptr;
    ARC_CUDA(ctx, cudaHostAlloc(&h, bytes, cudaHostAllocMapped));
    memset(h, 0, bytes);
    void *d = nullptr;
    cudaError_t err = cudaHostGetDevicePointer(&d, h, 0);
    ctx->counters.cuda_calls++;
    if (err != cudaSuccess) {
        cudaFreeHost(h);
        return arc_fail_cuda(err, "cudaHostGetDevicePointer", __func__);
    }
    *host_out = h;
    *device_out = d;
    return ARC_OK;
}

extern "C" int arc_host_free(arc_context *ctx, void *host_ptr) {
    ARC_REQUIRE(ctx, "ctx is null");
    ARC_CUDA(ctx, cudaFreeHost(host_ptr));
    return ARC_OK;
}

extern "C" int arc_enqueue_copy_to_device(arc_context *ctx, void *dst, const void *src,
                                        uint64_t bytes) {
    ARC_REQUIRE(ctx && dst && src, "null argument");
    ARC_REQUIRE(!ctx->capturing, "copies are not captured into graphs");
    ARC_CUDA(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream));
    return ARC_OK;
}

// A device-to-host copy into pageable memory would block until it completed; only pinned
// destinations are accepted, so the call always returns at once.
extern "C" int arc_enqueue_copy_to_host(arc_context *ctx, void *pinned_dst, const void *src,
                                      uint64_t bytes) {
    ARC_REQUIRE(ctx && pinned_dst && src, "null argument");
    cudaPointerAttributes attr;
    ARC_CUDA(ctx, cudaPointerGetAttributes(&attr, pinned_dst));
    ARC_REQUIRE(attr.type == cudaMemoryTypeHost,
                "destination is not pinned host memory (allocate it with arc_host_alloc)");
    ARC_CUDA(ctx, cudaMemcpyAsync(pinned_dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    return ARC_OK;
}

// Device to device; used to measure the copy bandwidth that bounds a memory-bound forward.
extern "C" int arc_enqueue_copy_on_device(arc_context *ctx, void *dst, const void *src, uint64_t bytes) {
    ARC_REQUIRE(ctx && dst && src, "null argument");
    ARC_CUDA(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream));
    return ARC_OK;
}
