// head_argmax.cuh -- the greedy step's argmax as the lm_head GEMV's epilogue (gemv.cu's AM
// variant): each row's logit as one order key, the grid's maximum by one atomic a block, and the
// last block's commit. arc_model_forward_commit launches it; arc_op_gemv_argmax tests it.
#pragma once

#include "commit.cuh"
#include "sample_math.cuh"

// The argmax's order on (value, row) as one unsigned key, the larger winning: NaN beats every
// number (all NaNs alike), -0 equals +0, and equal values go to the lower row: NumPy's rule, the
// argmax kernel's (argmax.cu). 0 is no key.
__device__ __forceinline__ unsigned long long argmax_key(float v, int row) {
    return (unsigned long long)value_key(v) << 32 | (uint32_t)~row;
}

// What an AM GEMV lane has seen of the rows it wrote: their best argmax key, and the smallest
// logit's order key, inverted so that 0 is none and the larger wins, as for `best`. The commit
// latches flat logits (model/../commit.cuh) where the smallest meets the largest.
struct ArgmaxSeen {
    unsigned long long best = 0;
    uint32_t low = 0;
    __device__ __forceinline__ void see(float v, int row) {
        const unsigned long long k = argmax_key(v, row);
        best = k > best ? k : best;
        const uint32_t l = ~(uint32_t)(k >> 32);
        low = l > low ? l : low;
    }
};

// Where an AM GEMV's argmax goes: the loop's commit (commit), or *out and *value_out.
struct GemvArgmax {
    HeadArgmax *h;
    int commit;
    CommitArgs c;
    int32_t *out;
    float *value_out;
};

// The end of an AM GEMV block of WARPS warps: the block's best key and smallest logit join the
// grid's (atomic maxima), and the last block to finish (its ticket wraps the count back to 0)
// takes the winner, resets both, and commits it or writes it out. `seen`: lane 0's of each warp,
// nothing seen for the others.
template <int WARPS>
__device__ __forceinline__ void argmax_finish(ArgmaxSeen seen, const GemvArgmax &a) {
    __shared__ unsigned long long wbest[WARPS];
    __shared__ uint32_t wlow[WARPS];
    if (threadIdx.x % 32 == 0) {
        wbest[threadIdx.x / 32] = seen.best;
        wlow[threadIdx.x / 32] = seen.low;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    unsigned long long best = seen.best;
    uint32_t low = seen.low;
#pragma unroll
    for (int w = 1; w < WARPS; ++w) {
        best = wbest[w] > best ? wbest[w] : best;
        low = wlow[w] > low ? wlow[w] : low;
    }
    if (best != 0) atomicMax(&a.h->best, best);
    if (low != 0) atomicMax(&a.h->low, low);
    __threadfence();  // the maxima land before the ticket
    if (atomicInc(&a.h->done, gridDim.x - 1) != gridDim.x - 1) return;
    __threadfence();
    best = atomicExch(&a.h->best, 0ull);
    low = atomicExch(&a.h->low, 0u);
    const uint32_t k = (uint32_t)(best >> 32);
    const int row = (int)~(uint32_t)best;
    const float value = k == 0xffffffffu ? quiet_nan() : key_value(k);
    if (a.commit) {
        commit_token(a.c, row, value, k == ~low);
    } else {
        if (a.value_out) *(volatile float *)a.value_out = value;
        *(volatile int32_t *)a.out = row;
        __threadfence_system();
    }
}
