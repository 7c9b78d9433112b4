// mask.cu -- a token mask from the host, applied in the device loop's step: a grammar's allowed
// ids for the token the step is to publish. The host writes the mask for token n of the sequence
// into the loop's mapped mask block once it has seen tokens 0..n-1 in the ring, then the ready
// word; the step, after its forward, waits on the device until ready says its mask is there, and
// sets the logits of the ids it forbids to -inf before the sampler. The forward of the next step
// runs while the host computes the mask, so the host never waits on the GPU, nor the GPU on the
// host, unless the mask takes longer than a forward.
#include <math.h>

#include "commit.cuh"
#include "device_math.cuh"
#include "internal.cuh"
#include "launch.cuh"

enum { MASK_THREADS = 1024 };

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The ready word, read from host memory with system-scope acquire: the mask words the host wrote
// before it are visible to the loads after.
__device__ __forceinline__ uint32_t load_ready(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// One block: thread 0 waits (only where the step's commit will publish: a latched fault, a stop
// id or the burst's limit leave nothing to mask), then every thread clears the forbidden logits
// of ids [0, width); ids at or past vocab (a padded lm_head) are forbidden too. Waiting longer than
// ARC_MASK_WAIT_US latches ARC_FAULT_MASK_TIMEOUT, which the commit then honours.
__global__ void __launch_bounds__(MASK_THREADS)
mask_kernel(CommitArgs c, const uint32_t *words, const uint32_t *ready, float *logits, int width) {
    __shared__ bool go;
    pdl_wait();  // the logits come from the forward, the state from the last commit
    if (threadIdx.x == 0) {
        go = will_publish(c);
        if (go) {
            const uint32_t want = c.st->published + 1;
            const uint64_t t0 = global_ns();
            while (load_ready(ready) < want) {
                if (global_ns() - t0 > (uint64_t)ARC_MASK_WAIT_US * 1000u) {
                    latch_fault(c, ARC_FAULT_MASK_TIMEOUT, -1, c.st->position + 1);
                    go = false;
                    break;
                }
                __nanosleep(256);
            }
        }
    }
    __syncthreads();
    if (!go) return;
    const volatile uint32_t *w = words;
    for (int i = threadIdx.x; i < width; i += MASK_THREADS) {
        const bool allowed = i < c.vocab && ((w[i >> 5] >> (i & 31)) & 1u);
        if (!allowed) logits[i] = -INFINITY;
    }
}

static int mask_alloc(arc_loop *loop) {
    arc_context *ctx = loop->ctx;
    const size_t n_words = ((size_t)loop->vocab + 31) / 32, bytes = (n_words + 1) * sizeof(uint32_t);
    void *h = nullptr, *d = nullptr;
    ARC_CUDA(ctx, cudaHostAlloc(&h, bytes, cudaHostAllocMapped));
    loop->mask_host = (uint32_t *)h;
    memset(h, 0, bytes);
    ARC_CUDA(ctx, cudaHostGetDevicePointer(&d, h, 0));
    loop->mask_dev = (uint32_t *)d;
    return ARC_OK;
}

extern "C" int arc_loop_mask_block(arc_loop *loop, uint32_t **words, uint32_t **ready) {
    ARC_REQUIRE(loop && words && ready, "null argument");
    if (!loop->mask_host) {
        ARC_REQUIRE(!loop->ctx->capturing, "the mask block cannot be allocated while a graph is being captured");
        ARC_TRY(mask_alloc(loop));
    }
    *words = loop->mask_host + 1;
    *ready = loop->mask_host;
    return ARC_OK;
}

extern "C" int arc_loop_enqueue_mask(arc_loop *loop, float *logits, int32_t width) {
    ARC_REQUIRE(loop && logits, "null argument");
    ARC_REQUIRE(loop->mask_host, "no mask block: call arc_loop_mask_block first");
    ARC_REQUIRE(loop->vocab <= width, "loop vocab %d exceeds the logits' width %d", loop->vocab, width);
    return arc_launch_pdl(loop->ctx, "mask_kernel", mask_kernel, dim3(1), dim3(MASK_THREADS), 0, commit_args(loop),
                          (const uint32_t *)(loop->mask_dev + 1), (const uint32_t *)loop->mask_dev, logits, width);
}
