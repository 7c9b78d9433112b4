// gemm_sm90.cu -- the prefill's large products on Hopper: d = a w^T (+ d) in float32, with a the
// chunk's activations (m, k) bf16 and w a weight matrix (n, k) bf16 as the model stores it. The
// kernel is CUTLASS's warp-specialized cooperative GEMM for sm_90a (TMA loads into a multi-stage
// shared-memory ring, wgmma on two consumer warp groups, a persistent tile scheduler), instantiated
// once: 128 x 256 x 64 tiles, clusters of two along m, float32 sums and a float32 output with
// d = alpha a w^T + beta d (beta 1 is the residual add; beta 0 a plain store). gemm.cu routes the
// products that fill the GPU here and keeps its own kernel for the rest and for other GPUs.
//
// This file alone is compiled for sm_90a (setup.py), with ARC_SM90A defined; built without it
// (no sm_90 target) it provides the same entry points, which report the path unavailable.

// CUTLASS's device-side assertions are calls, and a call inside the wgmma pipeline makes ptxas
// serialize every wgmma: they stay out (defined before any header brings in assert).
#ifndef NDEBUG
#define NDEBUG
#endif

#include "gemm_sm90.cuh"

#ifdef ARC_SM90A

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

namespace {

using namespace cute;

using ElementA = cutlass::bfloat16_t;  // a (m, k), row-major
using ElementB = cutlass::bfloat16_t;  // w (n, k) row-major: the product's B (k, n) column-major
using ElementD = float;                // d (m, n), row-major; also the source C when beta = 1
using TileShape = Shape<_128, _256, _64>;
using ClusterShape = Shape<_2, _1, _1>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementD, cutlass::layout::RowMajor, 4, ElementD,
    cutlass::layout::RowMajor, 4, cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cutlass::layout::RowMajor, 8, ElementB,
    cutlass::layout::ColumnMajor, 8, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

}  // namespace

bool gemm_sm90_available(const arc_context *ctx) { return ctx->cc_major == 9; }

int gemm_sm90(arc_context *ctx, const char *who, const uint16_t *w, const GemmIo &io) {
    const uint16_t *a = io.a;
    const int m = io.m, n = io.n, k = io.k;
    float *d = io.c;
    const bool accumulate = io.accumulate != 0;
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideC = typename Gemm::GemmKernel::StrideC;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    // Dense row-major (and W's rows as B's columns): the leading stride is the row length.
    StrideA sa{};
    StrideB sb{};
    StrideC sc{};
    StrideD sd{};
    cute::get<0>(sa) = k;
    cute::get<0>(sb) = k;
    cute::get<0>(sc) = n;
    cute::get<0>(sd) = n;
    cutlass::KernelHardwareInfo hw;
    hw.device_id = ctx->device;
    hw.sm_count = ctx->sm_count;
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {m, n, k, 1},
                                  {reinterpret_cast<const ElementA *>(a), sa, reinterpret_cast<const ElementB *>(w), sb},
                                  {{1.0f, accumulate ? 1.0f : 0.0f}, d, sc, d, sd},
                                  hw};
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess)
        return arc_fail(ARC_INVALID_ARGUMENT, who, "the sm_90 product cannot take m %d, n %d, k %d", m, n, k);
    if (Gemm::get_workspace_size(args) != 0)
        return arc_fail(ARC_INVALID_ARGUMENT, who, "the sm_90 product asks for a workspace, m %d, n %d, k %d", m, n, k);
    // initialize sets the kernel's shared-memory attribute (legal while capturing); run launches.
    const bool ok = gemm.initialize(args, nullptr, ctx->stream) == cutlass::Status::kSuccess &&
                    gemm.run(ctx->stream) == cutlass::Status::kSuccess;
    ctx->counters.cuda_calls += 2;
    if (!ok) {
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return arc_fail_cuda(err, "gemm_sm90", who);
        return arc_fail(ARC_CUDA_ERROR, who, "the sm_90 product failed to launch (m %d, n %d, k %d)", m, n, k);
    }
    ARC_LAUNCHED(ctx, "gemm_sm90");
    return ARC_OK;
}

#else

bool gemm_sm90_available(const arc_context *) { return false; }

int gemm_sm90(arc_context *, const char *who, const uint16_t *, const GemmIo &) {
    return arc_fail(ARC_INVALID_ARGUMENT, who, "this library was built without sm_90a code");
}

#endif
