// head_argmax.cuh -- the greedy step's argmax as the lm_head GEMV's epilogue (gemv.cu's AM
// variant): each row's logit as one order key, the grid's maximum by one atomic a block, and the
// last block's commit. arc_model_forward_commit launches it; arc_op_gemv_argmax tests it.
#pragma once

#include "../commit.cuh"
#include "../draw_math.cuh"

// The argmax's order on (value, row) as one unsigned key, the larger winning: NaN beats every
// number (all NaNs alike), -0 equals +0, and equal values go to the lower row: NumPy's rule, the
// argmax kernel's (sampler.cu). 0 is no key.
__device__ __forceinline__ unsigned long long argmax_key(float v, int row) {
    const uint32_t k = v != v ? 0xffffffffu : order_key(v == 0.0f ? 0.0f : v);
    return (unsigned long long)k << 32 | (uint32_t)~row;
}

// Where an AM GEMV's argmax goes: the loop's commit (commit), or *out and *value_out.
struct GemvArgmax {
    HeadArgmax *h;
    int commit;
    CommitArgs c;
    int32_t *out;
    float *value_out;
};

// The end of an AM GEMV block of WARPS warps: the block's best key joins the grid's (an atomic
// max), and the last block to finish (its ticket wraps the count back to 0) takes the winner,
// resets it, and commits it or writes it out. `best`: lane 0's key of each warp, 0 for the others.
template <int WARPS>
__device__ __forceinline__ void argmax_finish(unsigned long long best, const GemvArgmax &a) {
    __shared__ unsigned long long wbest[WARPS];
    if (threadIdx.x % 32 == 0) wbest[threadIdx.x / 32] = best;
    __syncthreads();
    if (threadIdx.x != 0) return;
#pragma unroll
    for (int w = 1; w < WARPS; ++w) best = wbest[w] > best ? wbest[w] : best;
    if (best != 0) atomicMax(&a.h->best, best);
    __threadfence();  // the max lands before the ticket
    if (atomicInc(&a.h->done, gridDim.x - 1) != gridDim.x - 1) return;
    __threadfence();
    best = atomicExch(&a.h->best, 0ull);
    const uint32_t k = (uint32_t)(best >> 32);
    const int row = (int)~(uint32_t)best;
    const float value = k == 0xffffffffu ? quiet_nan() : key_value(k);
    if (a.commit) {
        commit_token(a.c, row, value);
    } else {
        if (a.value_out) *(volatile float *)a.value_out = value;
        *(volatile int32_t *)a.out = row;
        __threadfence_system();
    }
}
