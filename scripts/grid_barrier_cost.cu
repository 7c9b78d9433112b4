// grid_barrier_cost.cu -- what a grid-wide barrier costs inside one kernel, against what a node of
// a captured graph with programmatic dependent launch costs: the sync a persistent forward would
// pay per dependency, against the one the step graph pays; and what the hardware barrier of a
// thread-block cluster costs. The grid barrier is grid_sync.cuh's.
// Build and run from the repository's root (the CUDA 13 wheels' nvcc, as setup.py finds it):
//   nvcc -std=c++17 -O3 -Ilibarc -gencode=arch=compute_90,code=sm_90 -L<cu13>/lib -cudart=static \
//        scripts/grid_barrier_cost.cu -o grid_barrier_cost && ./grid_barrier_cost
#include <cstdio>
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "grid_sync.cuh"
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

// k barriers, then the last block out resets the count (as the draw does).
__global__ void barriers(unsigned *arrivals, unsigned *exit_count, int k, float *sink) {
    float acc = threadIdx.x;
    for (int i = 0; i < k; ++i) { acc = acc * 1.0001f + 1.0f; grid_sync(arrivals); }
    __shared__ bool last;
    if (threadIdx.x == 0) { __threadfence(); last = atomicAdd(exit_count, 1u) == gridDim.x - 1; }
    __syncthreads();
    if (last && threadIdx.x == 0) { *arrivals = 0; *exit_count = 0; }
    if (acc == -1.0f) *sink = acc;
}

// k cluster barriers (the hardware's, across the blocks of one cluster), each after an add into
// the next block's shared memory: the exchange a draw inside one cluster pays per step of it.
__global__ void cluster_barriers(int k, float *sink) {
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    __shared__ unsigned long long slot;
    if (threadIdx.x == 0) slot = 0;
    cl.sync();
    unsigned long long *next = cl.map_shared_rank(&slot, (cl.block_rank() + 1) % cl.num_blocks());
    for (int i = 0; i < k; ++i) {
        if (threadIdx.x == 0) atomicAdd(next, 1ull);
        cl.sync();
    }
    if (slot == 12345678ull) *sink = 1.0f;
}

__global__ void tiny(float *sink) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x == 0 && blockIdx.x == 0) sink[0] += 1.0f;
}

int main() {
    unsigned *b, *ex; float *sink;
    CK(cudaMalloc(&b, 4)); CK(cudaMemset(b, 0, 4));
    CK(cudaMalloc(&ex, 4)); CK(cudaMemset(ex, 0, 4));
    CK(cudaMalloc(&sink, 4)); CK(cudaMemset(sink, 0, 4));
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int reps = 200;
    int blocks_list[] = {8, 32, 66, 132};
    for (int bi = 0; bi < 4; ++bi) {
        int blocks = blocks_list[bi];
        float us[2];
        int ks[2] = {1, 65};
        for (int j = 0; j < 2; ++j) {
            for (int w = 0; w < 10; ++w) barriers<<<blocks, 256, 0, s>>>(b, ex, ks[j], sink);
            CK(cudaEventRecord(e0, s));
            for (int r = 0; r < reps; ++r) barriers<<<blocks, 256, 0, s>>>(b, ex, ks[j], sink);
            CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); us[j] = ms * 1000.0f / reps;
        }
        printf("grid barrier, %3d blocks of 256: %.3f us per barrier (launch with 1 barrier %.2f us, with 65 %.2f us)\n",
               blocks, (us[1] - us[0]) / 64.0f, us[0], us[1]);
    }
    // Graph of N dependent tiny kernels with programmatic dependent launch, per node.
    for (int blocks : {1, 132}) {
        float per[2]; int ns[2] = {1, 65};
        for (int j = 0; j < 2; ++j) {
            cudaGraph_t g; cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < ns[j]; ++i) {
                cudaLaunchAttribute a; a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
                a.val.programmaticStreamSerializationAllowed = 1;
                cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(blocks); cfg.blockDim = dim3(256); cfg.stream = s;
                cfg.attrs = &a; cfg.numAttrs = 1;
                CK(cudaLaunchKernelEx(&cfg, tiny, sink));
            }
            CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
            for (int w = 0; w < 10; ++w) CK(cudaGraphLaunch(ge, s));
            CK(cudaEventRecord(e0, s));
            for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, s));
            CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); per[j] = ms * 1000.0f / reps;
            cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
        }
        printf("graph node (PDL), %3d blocks of 256: %.3f us per node (graph of 1: %.2f us, of 65: %.2f us)\n",
               blocks, (per[1] - per[0]) / 64.0f, per[0], per[1]);
    }
    for (int threads : {512, 1024}) {
        for (int size : {2, 8, 16}) {
            CK(cudaFuncSetAttribute(cluster_barriers, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
            cudaLaunchAttribute a; a.id = cudaLaunchAttributeClusterDimension;
            a.val.clusterDim.x = size; a.val.clusterDim.y = 1; a.val.clusterDim.z = 1;
            cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(size); cfg.blockDim = dim3(threads); cfg.stream = s;
            cfg.attrs = &a; cfg.numAttrs = 1;
            float us[2]; int ks[2] = {1, 65};
            for (int j = 0; j < 2; ++j) {
                for (int w = 0; w < 10; ++w) CK(cudaLaunchKernelEx(&cfg, cluster_barriers, ks[j], sink));
                CK(cudaEventRecord(e0, s));
                for (int r = 0; r < reps; ++r) CK(cudaLaunchKernelEx(&cfg, cluster_barriers, ks[j], sink));
                CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1));
                float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); us[j] = ms * 1000.0f / reps;
            }
            printf("cluster barrier, cluster of %2d blocks of %4d: %.3f us per barrier (launch with 1 barrier %.2f us, with 65 %.2f us)\n",
                   size, threads, (us[1] - us[0]) / 64.0f, us[0], us[1]);
        }
    }
    printf("SMs %d\n", sms);
    return 0;
}
