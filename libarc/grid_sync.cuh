// grid_sync.cuh -- a barrier across every block of a grid whose blocks are all resident at once
// (launched no larger than the occupancy allows): the draw's (sample.cu), and what
// scripts/grid_barrier_cost.cu measures.
#pragma once

#include <stdint.h>

// Every block of the grid arrives before any leaves. The arrival count only grows during a launch
// (whoever knows every block has left resets it): barrier k is passed once k * gridDim.x blocks
// have arrived.
__device__ inline void grid_sync(uint32_t *arrivals) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        uint32_t arrived = atomicAdd(arrivals, 1u) + 1;
        uint32_t target = (arrived + gridDim.x - 1) / gridDim.x * gridDim.x;
        volatile uint32_t *count = arrivals;
        while (*count < target) {
        }
        __threadfence();
    }
    __syncthreads();
}
