// qgemv_bulk.cuh -- the quantized GEMV's main loop on sm_90 and later (qgemv.cuh's qgemv_kernel
// runs it for every instance but the routed ones): the weights streamed into shared memory by the
// copy engine (cp.async.bulk), so that a warp's bytes in flight do not depend on its registers.
// Included by qgemv.cuh after its task rows (qtask_rows, qrow_offset); the staging is qinput.cuh's
// and the epilogue gemv_common.cuh's, as the register loop's.
#pragma once

// The register loop (qgemv.cuh) holds a batch of loads a lane and waits on it before its dots, so a
// warp's bytes in flight stop at what its registers hold. Here the copy engine streams each warp's
// weights into a ring of QBULK stages of its own in shared memory: a stage is one chunk of 32
// units (lane i's unit the i-th) of each of the task's NR rows, copied by cp.async.bulk, one copy
// a plane a row issued by lane 0, completing on the stage's mbarrier. The warp's chunks run over
// its tasks in order, the ring's stages ahead of the dots, so loads stay in flight through the
// dots, the epilogue and the next task at no instruction a weight byte. Each lane reads its units
// from shared memory and adds them in main's order (the same units, ascending), so the products
// are the register loop's bits.

// A chunk: 32 units, the warp's unit of work and of copy (chunk c holds units 32c .. 32c + 31).
// Bytes a stage holds of one row, by plane: quants (A), high bits (B), scales (C), Q6_K's d (D).
// A chunk begins a plane at a 16-byte boundary, except Q6_K's D (2 bytes a superblock, so 8 a
// chunk): it is copied as the 16 aligned bytes that hold it.
template <int F> struct QChunk {
    static constexpr uint32_t A = 32u * (F == ARC_FORMAT_Q8_0 ? 32u : 16u);
    static constexpr uint32_t B = F == ARC_FORMAT_Q5_K ? 128u : F == ARC_FORMAT_Q6_K ? 256u : 0u;
    static constexpr uint32_t C = F == ARC_FORMAT_Q4_1 ? 128u : 64u;
    static constexpr uint32_t D = F == ARC_FORMAT_Q6_K ? 16u : 0u;
    static constexpr uint32_t ROW = A + B + C + D;
};

// Stages a warp's ring holds: as many as QBULK_RING bytes allow, at least 3 (two in flight while
// the third is read), at most 8.
constexpr uint32_t QBULK_RING = 8192;
constexpr int qbulk_stages(uint32_t stage_bytes) {
    return QBULK_RING / stage_bytes < 3 ? 3 : QBULK_RING / stage_bytes > 8 ? 8 : (int)(QBULK_RING / stage_bytes);
}
template <int F, int NR> struct QBulk {
    static constexpr uint32_t STAGE = NR * QChunk<F>::ROW;
    static constexpr int S = qbulk_stages(STAGE);
    static constexpr uint32_t WARP = S * STAGE;  // a warp's ring
};
// Chunks copied before the dependency wait (weights no kernel writes), the rest after the staging.
constexpr int QBULK_EARLY = 1;

// Bytes of dynamic shared memory a launch needs: the staged input, then (bulk) 8 rings and their
// mbarriers, the rings 128-byte aligned.
__host__ __device__ constexpr uint32_t qbulk_ring_at(int units) { return ((uint32_t)units * (uint32_t)QGEMV_STAGE_BYTES + 127u) & ~127u; }

template <int F, int NR>
constexpr size_t qbulk_smem(int units) {
    return qbulk_ring_at(units) + GEMV_WARPS * (QBulk<F, NR>::WARP + 8u * QBulk<F, NR>::S);
}

__device__ __forceinline__ void mbar_init(uint32_t bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n\t.reg .pred done;\n\t"
        "WAIT:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
        "@!done bra WAIT;\n\t}" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const uint8_t *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// Lane 0: chunk c (n units) of the NR rows rix of w copied into the stage at `dst`, on `bar`.
template <int F, int NR>
__device__ __forceinline__ void qbulk_issue(const uint8_t *w, const RowLayout &L, const uint32_t (&rix)[NR], int c,
                                            int n, uint32_t dst, uint32_t bar) {
    using K = QChunk<F>;
    const uint32_t u0 = 32u * (uint32_t)c, nu = (uint32_t)n;
    // Sizes of the copies: whole 16-byte pieces, within each plane's padding (arc.h).
    const uint32_t a = nu * (K::A / 32u);
    const uint32_t b = pad16(nu * (K::B / 32u));
    const uint32_t cc = F == ARC_FORMAT_Q4_K || F == ARC_FORMAT_Q5_K ? 16u * (nu / 8u) : pad16(nu * (K::C / 32u));
    const uint32_t d = K::D;
    mbar_expect(bar, NR * (a + b + cc + d));
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        const uint8_t *row = w + qrow_offset(rix[r], L.bytes);
        const uint32_t to = dst + (uint32_t)r * K::ROW;
        bulk_copy(to, row + u0 * (K::A / 32u), a, bar);
        if constexpr (K::B != 0) bulk_copy(to + K::A, row + L.b + u0 * (K::B / 32u), b, bar);
        bulk_copy(to + K::A + K::B, row + L.c + u0 * (K::C / 32u), cc, bar);
        if constexpr (K::D != 0) bulk_copy(to + K::A + K::B + K::C, row + L.d + ((u0 / 4u) & ~15u), d, bar);
    }
}

// Unit v of chunk c from a stage's row (`s`), as load_unit reads it from the weights.
template <int F>
__device__ __forceinline__ void qbulk_unit(const uint8_t *s, int c, int v, UnitRaw &r) {
    using K = QChunk<F>;
    if constexpr (F == ARC_FORMAT_Q8_0) {
        r.q0 = *reinterpret_cast<const uint4 *>(s + 32 * v);
        r.q1 = *reinterpret_cast<const uint4 *>(s + 32 * v + 16);
    } else {
        r.q0 = *reinterpret_cast<const uint4 *>(s + 16 * v);
    }
    const uint8_t *b = s + K::A, *sc = s + K::A + K::B;
    if constexpr (F == ARC_FORMAT_Q5_K) r.hb.x = *reinterpret_cast<const uint32_t *>(b + 4 * v);
    if constexpr (F == ARC_FORMAT_Q6_K) r.hb = *reinterpret_cast<const uint2 *>(b + 8 * v);
    if constexpr (F == ARC_FORMAT_Q8_0 || F == ARC_FORMAT_Q4_0 || F == ARC_FORMAT_Q6_K)
        r.s.x = *reinterpret_cast<const uint16_t *>(sc + 2 * v);
    if constexpr (F == ARC_FORMAT_Q4_1) r.s.x = *reinterpret_cast<const uint32_t *>(sc + 4 * v);
    if constexpr (F == ARC_FORMAT_Q4_K || F == ARC_FORMAT_Q5_K) r.s = *reinterpret_cast<const uint4 *>(sc + 16 * (v / 8));
    if constexpr (F == ARC_FORMAT_Q6_K)
        r.s.y = *reinterpret_cast<const uint16_t *>(sc + K::C + 8 * (c & 1) + 2 * (v / 8));
}

// qgemv_kernel's body on the bulk loop: the same arguments, work split, staging and epilogues.
template <int F, int R, int KS, bool GATED, bool AM, bool HAND>
__device__ __forceinline__ void qgemv_bulk(const uint8_t *__restrict__ w, const float *__restrict__ x, int rows,
                                           int cols, const uint16_t *__restrict__ bias,
                                           const uint16_t *__restrict__ norm_w, float eps, float norm_add,
                                           int accumulate, float *__restrict__ y, const GemvArgmax &am,
                                           const QuantHandoff &hand) {
    constexpr int NR = GATED ? 2 * R : R;
    constexpr int GROUPS = GEMV_WARPS / KS;
    using Q = QBulk<F, NR>;
    extern __shared__ __align__(128) int4 staged[];
    __shared__ float red[GEMV_WARPS];
    const int units = cols / QUNIT;
    const RowLayout L = row_layout(F, cols);
    int2 *sums = reinterpret_cast<int2 *>(staged + 2 * units);
    float *dxs = reinterpret_cast<float *>(sums + units);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int group = warp / KS, part = warp % KS;
    const int block_tasks = ((rows + R - 1) / R + GROUPS - 1) / GROUPS;
    uint8_t *ring = reinterpret_cast<uint8_t *>(staged) + qbulk_ring_at(units) + (uint32_t)warp * Q::WARP;
    const uint32_t ring_s = smem_addr(ring);
    const uint32_t bars = smem_addr(reinterpret_cast<uint8_t *>(staged) + qbulk_ring_at(units) +
                                    GEMV_WARPS * Q::WARP) + 8u * (uint32_t)(warp * Q::S);
    // The warp's chunks of a task: part, part + KS, ... below the row's chunk count.
    const int chunks = (units + 31) / 32;
    const int per_task = part < chunks ? (chunks - 1 - part) / KS + 1 : 0;
    const int tasks = (int)blockIdx.x < block_tasks ? (block_tasks - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int items = tasks * per_task;
    // Item j: the task's rows and the chunk, copied into stage j % S (lane 0).
    auto issue = [&](int j) {
        const int t = j / per_task, m = j - t * per_task;
        uint32_t rix[NR];
        qtask_rows<R, GATED>(((int)blockIdx.x + t * (int)gridDim.x) * GROUPS + group, rows, rix);
        const int c = part + KS * m;
        const int s = j % Q::S;
        qbulk_issue<F, NR>(w, L, rix, c, min(32, units - 32 * c), ring_s + (uint32_t)s * Q::STAGE, bars + 8u * s);
    };

    pdl_launch_dependents();
    if (lane == 0) {
        for (int s = 0; s < Q::S; ++s) mbar_init(bars + 8u * s);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int j = 0; j < QBULK_EARLY && j < Q::S && j < items; ++j) issue(j);
    }
    __syncwarp();
    pdl_wait();
    stage_input(x, cols, norm_w, eps, norm_add, HAND ? hand.in : nullptr, staged, dxs, sums, red);
    if (lane == 0)
        for (int j = QBULK_EARLY; j < Q::S && j < items; ++j) issue(j);
    __syncthreads();

    const KSlot ks = k_slot(lane % 8);
    ArgmaxSeen seen;
    int j = 0;  // the warp's next item
    for (int bt = blockIdx.x; bt < block_tasks; bt += gridDim.x) {
        const int task = bt * GROUPS + group;
        float acc[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
        for (int m = 0; m < per_task; ++m, ++j) {
            const int c = part + KS * m, s = j % Q::S;
            mbar_wait(bars + 8u * s, (uint32_t)(j / Q::S) & 1u);
            if (32 * c + lane < units) {
                const uint8_t *st = ring + (uint32_t)s * Q::STAGE;
                UnitRaw raw[NR];
#pragma unroll
                for (int r = 0; r < NR; ++r) qbulk_unit<F>(st + r * QChunk<F>::ROW, c, lane, raw[r]);
                const UnitInput in = qinput(staged, dxs, sums, 32 * c + lane);
#pragma unroll
                for (int r = 0; r < NR; ++r) acc[r] += dot_unit<F>(raw[r], ks, in);
            }
            __syncwarp();  // every lane's reads of the stage done before it is refilled
            if (lane == 0 && j + Q::S < items) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                issue(j + Q::S);
            }
        }
        gemv_finish_task<R, KS, GATED, AM>(acc, task, rows, bias, accumulate, y, seen);
    }
    if constexpr (GATED && HAND) {
        if (hand.out != nullptr && part == 0) quant_handoff<R, GROUPS>(y, rows, block_tasks, group, hand, lane);
    }
    if constexpr (AM) argmax_finish<GEMV_WARPS>(seen, am);
}

