// scales.cu -- the elementwise factors of scales.cuh: a layer's output scalar, and the logits' soft
// cap, each a pass over rows in place, enqueued with programmatic dependent launch like the kernels
// around it.
#include <math.h>

#include "device_math.cuh"
#include "launch.cuh"
#include "model/scales.cuh"

enum { SCALE_THREADS = 256, SOFTCAP_MAX_BLOCKS = 1024 };

// x[blockIdx.y][v] *= s, four floats a thread a pass.
__global__ void __launch_bounds__(SCALE_THREADS) scale_rows_kernel(float *__restrict__ x, int dim, const uint16_t *s) {
    pdl_launch_dependents();
    pdl_wait();  // x is the layer's last op's output
    const float f = bf16_to_f32(*s);
    float4 *row = reinterpret_cast<float4 *>(x + (size_t)blockIdx.y * dim);
    for (int v = blockIdx.x * SCALE_THREADS + threadIdx.x; v < dim / 4; v += gridDim.x * SCALE_THREADS) {
        float4 a = row[v];
        a.x *= f, a.y *= f, a.z *= f, a.w *= f;
        row[v] = a;
    }
}

int launch_scale_rows(arc_context *ctx, float *x, int32_t rows, int32_t dim, const uint16_t *s) {
    ARC_REQUIRE(x && s, "null pointer (x and s are required)");
    ARC_REQUIRE(rows > 0 && dim > 0 && dim % 4 == 0 && (uintptr_t)x % 16 == 0,
                "rows %d and dim %d (a multiple of 4) must be positive, x 16-byte aligned", rows, dim);
    const int blocks = (dim / 4 + SCALE_THREADS - 1) / SCALE_THREADS;
    return arc_launch_pdl(ctx, "scale_rows_kernel", scale_rows_kernel, dim3(blocks, rows), dim3(SCALE_THREADS), 0, x,
                          (int)dim, s);
}

// y[blockIdx.y * ld + i] = cap * tanh(y / cap) for i < n: tanhf of the quotient rounded once, times
// cap, as the reference computes it in float32.
__global__ void __launch_bounds__(SCALE_THREADS)
softcap_rows_kernel(float *__restrict__ y, int n, int ld, float cap) {
    pdl_launch_dependents();
    pdl_wait();  // y is the lm_head's output
    float *row = y + (size_t)blockIdx.y * ld;
    for (int i = blockIdx.x * SCALE_THREADS + threadIdx.x; i < n; i += gridDim.x * SCALE_THREADS)
        row[i] = __fmul_rn(tanhf(__fdiv_rn(row[i], cap)), cap);
}

int launch_softcap_rows(arc_context *ctx, float *y, int32_t rows, int32_t n, int32_t ld, float cap) {
    ARC_REQUIRE(y, "y is null");
    ARC_REQUIRE(rows > 0 && n > 0 && ld >= n && cap > 0.0f && isfinite(cap),
                "rows %d, n %d (ld %d >= n) and cap %g must be positive", rows, n, ld, (double)cap);
    int blocks = (n + SCALE_THREADS - 1) / SCALE_THREADS;
    if (blocks > SOFTCAP_MAX_BLOCKS / rows + 1) blocks = SOFTCAP_MAX_BLOCKS / rows + 1;
    return arc_launch_pdl(ctx, "softcap_rows_kernel", softcap_rows_kernel, dim3(blocks, rows), dim3(SCALE_THREADS), 0,
                          y, (int)n, (int)ld, cap);
}
