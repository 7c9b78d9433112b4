// qgemv.cuh -- the GEMV over quantized weights (arc.h's arc_format), the decode's products for a
// model held in GGUF's block formats. Same work split, same epilogues and same launch as the
// bf16 GEMV (gemv_common.cuh: bias, residual, SwiGLU, the lm_head's argmax and commit); only
// the inner product differs: the weights stay packed and meet an int8 copy of the input in dp4a
// instructions (quant.cuh), so a 4-bit weight costs about half an instruction.
//
// Each block stages the input once (qinput.cuh): normed and quantized, or handed over from the
// SwiGLU GEMV. The weights stream through shared memory: each warp copies the units its lanes
// multiply (lane, lane + 32 * KS, ... of its task's rows) by cp.async into a ring of stages, a
// few items ahead of its dots (qgemv_kernel). Instances live in qgemv_*.cu, a few formats a
// file, so that nvcc compiles them in parallel.
#pragma once

#include "gemv_common.cuh"
#include "qinput.cuh"

// Units of a batch: a lane's units of one item over its NR rows, 4 entries (U units of each row).
constexpr int QGEMV_UNITS = 4;
constexpr int qgemv_batch(int nr) { return QGEMV_UNITS / nr > 0 ? QGEMV_UNITS / nr : 1; }

// The rows of task `task`: R output rows (GATED: their gate rows, then their up rows), as row
// indices; a row lies at w + index * row_bytes. A partial last task re-reads the last row; its
// result is never written. (An index and one multiply-add per load cost fewer registers than a
// 64-bit pointer per row.)
template <int R, bool GATED>
__device__ __forceinline__ void qtask_rows(int task, int rows, uint32_t (&rix)[GATED ? 2 * R : R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = min(task * R + r, rows - 1);
        rix[r] = (uint32_t)row;
        if constexpr (GATED) rix[R + r] = (uint32_t)(rows + row);
    }
}

// One entry of a stage in shared memory: what the 32 lanes of a warp need of one row for their
// units v0 .. v0 + 31 (v0 a multiple of 32, lane l's unit v0 + l), in planes that a warp reads
// with few bank conflicts, all copied in pieces of 16 bytes except SEGS's words:
//   quants   the 32 units' quants in order, 512 bytes (Q8_0: 1,024, lane l copying pieces l and
//            l + 32, so that each copy instruction reads 512 contiguous bytes);
//   chunks   16-byte runs of the row's other arrays that the 32 units cover, one a lane: Q4_0,
//            Q8_0 4 of d (8 units each; not SEGS); Q4_1 8 of d and m (4 units; not SEGS); Q4_K
//            the 4 superblock headers; Q5_K 8 runs of high bits (4 units each) then the 4
//            headers; Q6_K 16 runs of high bits (2 units) then 4 of scales (8 units), then (not
//            SEGS) the run holding the 4 superblocks' d;
//   words    SEGS (Q4_0, Q8_0, Q4_1, Q6_K): 32 x 4 bytes, each lane the aligned word holding its
//            unit's d (and Q4_1's m) or Q6_K's superblock d, since a run of those may span two
//            experts' segments (a segment is a whole number of superblocks, of units otherwise).
template <int F, bool SEGS>
struct QEntry {
    static constexpr int QUANTS = F == ARC_FORMAT_Q8_0 ? 1024 : 512;
    static constexpr int HIGH = F == ARC_FORMAT_Q5_K ? 8 : F == ARC_FORMAT_Q6_K ? 16 : 0;  // chunks of high bits
    static constexpr int SCALES = format_is_k(F) ? 4 : SEGS ? 0 : F == ARC_FORMAT_Q4_1 ? 8 : 4;
    static constexpr int CHUNKS = HIGH + SCALES + (F == ARC_FORMAT_Q6_K && !SEGS ? 1 : 0);
    static constexpr bool WORD = SEGS && (!format_is_k(F) || F == ARC_FORMAT_Q6_K);
    static constexpr int CHUNK_AT = QUANTS, WORD_AT = CHUNK_AT + 16 * CHUNKS;
    static constexpr int BYTES = WORD_AT + (WORD ? 128 : 0);
};

// The ring of stages a warp owns: as many stages (2 to 4) of QGEMV_UNITS entries as fit in
// QGEMV_RING_BYTES, so that two blocks of 8 warps an SM hold their rings and a staged input of
// up to 14,336 columns.
constexpr int QGEMV_RING_BYTES = 11776;
template <int F, bool SEGS>
constexpr int qgemv_stages() {
    constexpr int n = QGEMV_RING_BYTES / (QGEMV_UNITS * QEntry<F, SEGS>::BYTES);
    return n > 4 ? 4 : n < 2 ? 2 : n;
}

// Dynamic shared memory of an instance: the staged input (qinput.cuh), rounded to 16 bytes, then
// each warp's ring.
__host__ __device__ constexpr size_t qgemv_ring_at(int cols) {
    return ((size_t)(cols / QUNIT) * QGEMV_STAGE_BYTES + 15) / 16 * 16;
}
template <int F, bool SEGS>
constexpr size_t qgemv_smem(int cols) {
    return qgemv_ring_at(cols) + (size_t)GEMV_WARPS * qgemv_stages<F, SEGS>() * QGEMV_UNITS * QEntry<F, SEGS>::BYTES;
}

// Where the input's unit v of row index ri lies: the row's first byte, and (in `at`) the unit's
// place in that row. SEGS (ROUTED, not GATED): v lies in segment j = v / segu, at unit v - j segu
// of the row of the segment's expert, whose matrix begins seg_ro[j] bytes into w.
template <bool SEGS>
__device__ __forceinline__ const uint8_t *unit_row(const uint8_t *w, uint32_t ri, uint32_t row_bytes, int v, int segu,
                                                   const long long *seg_ro, int &at) {
    if constexpr (SEGS) {
        const int j = v / segu;
        at = v - j * segu;
        return w + seg_ro[j] + (size_t)ri * row_bytes;
    } else {
        at = v;
        return w + (size_t)ri * row_bytes;
    }
}

// Chunk c of an entry whose first unit is v0: the unit where it begins, then (once that unit's
// row and its place `at` there are known) the chunk's offset in the row.
template <int F, bool SEGS>
__device__ __forceinline__ int chunk_unit(int c, int v0) {
    using P = QEntry<F, SEGS>;
    if (c < P::HIGH) return v0 + (F == ARC_FORMAT_Q5_K ? 4 : 2) * c;
    if (c < P::HIGH + P::SCALES) return v0 + (F == ARC_FORMAT_Q4_1 ? 4 : 8) * (c - P::HIGH);
    return v0;  // Q6_K's d
}
template <int F, bool SEGS>
__device__ __forceinline__ uint32_t chunk_offset(const RowLayout &L, int c, uint32_t at) {
    using P = QEntry<F, SEGS>;
    if (c < P::HIGH) return L.b + (F == ARC_FORMAT_Q5_K ? 4u : 8u) * at;
    if (c < P::HIGH + P::SCALES) {
        if constexpr (F == ARC_FORMAT_Q4_K || F == ARC_FORMAT_Q5_K) return L.c + 16u * (at / 8);
        if constexpr (F == ARC_FORMAT_Q4_1) return L.c + 4u * at;
        return L.c + 2u * at;  // Q4_0, Q8_0 d; Q6_K's scales
    }
    return L.d + ((2u * (at / 8)) & ~15u);  // the 16 bytes holding the d of superblocks at / 8 .. + 3
}

// The copies of one entry (row index ri, the lane's unit v of the 32 from v - lane) into `dst`,
// each lane its part: its quants, its chunk (lanes below CHUNKS), its word. Units past `units`
// copy nothing (zero-filled from a legal, aligned address).
template <int F, bool SEGS>
__device__ __forceinline__ void copy_entry(uint32_t dst, const uint8_t *w, const RowLayout &L, uint32_t ri, int v,
                                           int units, int segu, const long long *seg_ro, int lane) {
    using P = QEntry<F, SEGS>;
    int at;
    const uint8_t *row = unit_row<SEGS>(w, ri, L.bytes, min(v, units - 1), segu, seg_ro, at);
    if constexpr (F == ARC_FORMAT_Q8_0) {  // pieces lane and lane + 32: units v0 + lane / 2 and v0 + 16 + lane / 2
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int vp = v - lane + 16 * h + lane / 2;
            int ap;
            const uint8_t *rp = unit_row<SEGS>(w, ri, L.bytes, min(vp, units - 1), segu, seg_ro, ap);
            cp_async16(dst + 512 * h + 16 * lane, rp + 32 * ap + 16 * (lane % 2), vp < units);
        }
    } else {
        cp_async16(dst + 16 * lane, row + 16 * at, v < units);
    }
    if constexpr (P::WORD) {
        const uint32_t off = F == ARC_FORMAT_Q4_1   ? L.c + 4u * (uint32_t)at
                             : F == ARC_FORMAT_Q6_K ? L.d + ((2u * (uint32_t)(at / 8)) & ~3u)
                                                    : L.c + ((2u * (uint32_t)at) & ~3u);
        cp_async4(dst + P::WORD_AT + 4 * lane, row + off, v < units);
    }
    if constexpr (P::CHUNKS > 0) {
        if (lane < P::CHUNKS) {
            const int vc = chunk_unit<F, SEGS>(lane, v - lane);
            int atc;
            const uint8_t *rc = unit_row<SEGS>(w, ri, L.bytes, vc < units ? vc : 0, segu, seg_ro, atc);
            cp_async16(dst + P::CHUNK_AT + 16 * lane, rc + chunk_offset<F, SEGS>(L, lane, (uint32_t)atc), vc < units);
        }
    }
}

// The raw unit of an entry `e` (quant.cuh's UnitRaw, the bytes load_unit loads), read by the lane
// whose unit it is, v; `at`: its place in its row (which half of a word is its own).
template <int F, bool SEGS>
__device__ __forceinline__ void read_entry(const uint8_t *e, int lane, int v, int at, UnitRaw &r) {
    using P = QEntry<F, SEGS>;
    const uint8_t *ch = e + P::CHUNK_AT;
    if constexpr (F == ARC_FORMAT_Q8_0) {
        r.q0 = *reinterpret_cast<const uint4 *>(e + 32 * lane);
        r.q1 = *reinterpret_cast<const uint4 *>(e + 32 * lane + 16);
    } else {
        r.q0 = *reinterpret_cast<const uint4 *>(e + 16 * lane);
    }
    if constexpr (F == ARC_FORMAT_Q4_K) r.s = *reinterpret_cast<const uint4 *>(ch + 16 * (lane / 8));
    if constexpr (F == ARC_FORMAT_Q5_K) {
        r.hb.x = *reinterpret_cast<const uint32_t *>(ch + 4 * lane);
        r.s = *reinterpret_cast<const uint4 *>(ch + 128 + 16 * (lane / 8));
    }
    if constexpr (F == ARC_FORMAT_Q6_K) {
        r.hb = *reinterpret_cast<const uint2 *>(ch + 8 * lane);
        r.s.x = *reinterpret_cast<const uint16_t *>(ch + 256 + 2 * lane);
        if constexpr (!SEGS)  // the d of superblock (v0 + lane) / 8 in the run from (2 (v0 / 8)) & ~15
            r.s.y = *reinterpret_cast<const uint16_t *>(ch + 320 + (((v - lane) / 4) & 15) + 2 * (lane / 8));
    }
    if constexpr (!SEGS && (F == ARC_FORMAT_Q4_0 || F == ARC_FORMAT_Q8_0))
        r.s.x = *reinterpret_cast<const uint16_t *>(ch + 2 * lane);
    if constexpr (!SEGS && F == ARC_FORMAT_Q4_1) r.s.x = *reinterpret_cast<const uint32_t *>(ch + 4 * lane);
    if constexpr (P::WORD) {
        const uint32_t word = *reinterpret_cast<const uint32_t *>(e + P::WORD_AT + 4 * lane);
        if constexpr (F == ARC_FORMAT_Q4_1) r.s.x = word;
        else if constexpr (F == ARC_FORMAT_Q6_K) r.s.y = word >> (16 * ((at / 8) & 1));
        else r.s.x = word >> (16 * (at & 1));
    }
}

// y[rows] = W[rows, cols] @ n(x) (+ bias) (+ y when accumulate), W in format F; GATED, AM, R,
// KS and ROUTED as in gemv_kernel (ROUTED, not GATED: rt.seg % 32 == 0, % 256 for _K; W's rows
// are rt.seg weights); HAND: the instance that takes part in the handoff (`hand`; the others
// compile without it). Dynamic shared memory: qgemv_smem<F, ROUTED && !GATED>(cols).
// Limits: cols % 32 == 0 (% 256 for _K), cols <= GEMV_MAX_COLS, W, x and norm_w 16-byte aligned.
//
// The main loop streams. A warp's work is a run of items: for each of its tasks in turn, nb
// batches, batch b holding the lane's units first + STEP k (k = b U .. b U + U - 1) of the task's
// NR rows. Each item is copied into the next stage of the warp's ring by cp.async, S - 1 items
// ahead of the one being multiplied, so the loads stay in flight through the dots, the epilogue
// and into the next task, and hold no registers; the first S - 1 are issued before the
// dependency wait, so their DRAM latency overlaps the kernel before. Each lane still adds its
// units' dots in the order of k, so the sums are those of one batch at a time.
template <int F, int R, int KS, bool GATED, bool AM, bool ROUTED, bool HAND>
__global__ void __launch_bounds__(GEMV_THREADS, GEMV_MIN_BLOCKS)
qgemv_kernel(const uint8_t *__restrict__ w, const float *__restrict__ x, int rows, int cols,
             const uint16_t *__restrict__ bias, const uint16_t *__restrict__ norm_w, float eps, float norm_add,
             int accumulate, float *__restrict__ y, GemvArgmax am, GemvRoute rt, QuantHandoff hand) {
    constexpr int NR = GATED ? 2 * R : R;
    constexpr int U = qgemv_batch(NR);
    constexpr int GROUPS = GEMV_WARPS / KS;
    constexpr int STEP = 32 * KS;
    constexpr bool SEGS = ROUTED && !GATED;
    using P = QEntry<F, SEGS>;
    constexpr int S = qgemv_stages<F, SEGS>(), ITEM = NR * U * P::BYTES;
    static_assert(NR * U == QGEMV_UNITS, "an item fills a stage");
    static_assert(!(AM && GATED), "the argmax is the lm_head's");
    static_assert(!(AM && ROUTED), "a routed product takes no argmax");
    extern __shared__ int4 staged[];  // [2 * units] int8 words, then (s0, s1)[units], then dx[units]; the rings
    __shared__ float red[GEMV_WARPS];
    __shared__ int route_ids[MOE_MAX_USED];  // ROUTED: the block's copy of the route
    __shared__ float route_scale[MOE_MAX_USED];
    __shared__ long long seg_ro[MOE_MAX_USED];
    const int units = cols / QUNIT;
    const RowLayout L = row_layout(F, ROUTED && !GATED ? rt.seg : cols);
    int2 *sums = reinterpret_cast<int2 *>(staged + 2 * units);  // 8-byte aligned for any units
    float *dxs = reinterpret_cast<float *>(sums + units);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int group = warp / KS, first = (warp % KS) * 32 + lane;
    const int block_tasks = ((rows + R - 1) / R + GROUPS - 1) / GROUPS;
    const int segu = rt.seg / QUNIT;  // SEGS: a segment's units
    uint8_t *ring = reinterpret_cast<uint8_t *>(staged) + qgemv_ring_at(cols) + (size_t)warp * S * ITEM;
    // The block's tasks (uniform over it, so every warp reaches the barriers of the epilogue) and
    // the batches of a task (those of the warp whose units reach furthest).
    const int ntasks = (int)blockIdx.x < block_tasks ? (block_tasks - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int nb = ((units + STEP - 1) / STEP + U - 1) / U;

    // The copy cursor: the next item to copy is batch cb of task ct, into stage cs.
    int ct = 0, cb = 0, cs = 0;
    uint32_t crix[NR];
    const uint8_t *crow[NR];  // not SEGS: the task's rows
    // Not SEGS, each copy is the row's start plus a lane's constant plus a multiple of the units
    // advanced (d = STEP (cb U + u), a multiple of 32): the quants at qoff + QS d, the chunk at
    // coff + cslope d (Q6_K's d: the run at (2 ((v0 + d) / 8)) & ~15, computed per copy).
    constexpr int QS = F == ARC_FORMAT_Q8_0 ? 32 : 16;
    const int v0 = first - lane, cunit = lane < P::CHUNKS ? chunk_unit<F, SEGS>(lane, v0) : v0;
    const bool dchunk = F == ARC_FORMAT_Q6_K && !SEGS && lane == P::CHUNKS - 1;
    const uint32_t qoff = F == ARC_FORMAT_Q8_0 ? 32u * v0 + 16u * lane : 16u * first;
    const uint32_t coff = lane < P::CHUNKS ? chunk_offset<F, SEGS>(L, lane, (uint32_t)cunit) : 0u;
    const uint32_t cslope = lane < P::HIGH ? (F == ARC_FORMAT_Q5_K ? 4u : 8u) : F == ARC_FORMAT_Q4_1 ? 4u : 2u;
    auto copy_next = [&]() {
        if (ct < ntasks) {
            if (cb == 0) {
                qtask_rows<R, GATED>(((int)blockIdx.x + ct * (int)gridDim.x) * GROUPS + group, rows, crix);
                if constexpr (ROUTED && GATED) {  // the chosen experts' gate rows, their up rows rt.up further
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        const int j = (int)crix[r] / rt.seg;
                        crix[r] = (uint32_t)(route_ids[j] * rt.seg) + (crix[r] - (uint32_t)(j * rt.seg));
                        crix[R + r] = (uint32_t)rt.up + crix[r];
                    }
                }
                if constexpr (!SEGS) {
#pragma unroll
                    for (int r = 0; r < NR; ++r) crow[r] = w + (size_t)crix[r] * L.bytes;
                }
            }
            const uint32_t dst = smem_addr(ring + cs * ITEM);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int d = STEP * (cb * U + u);
                if constexpr (SEGS) {
#pragma unroll
                    for (int r = 0; r < NR; ++r)
                        copy_entry<F, SEGS>(dst + (u * NR + r) * P::BYTES, w, L, crix[r], first + d, units, segu, seg_ro,
                                            lane);
                } else {
                    // Past the end, nothing is read: the row's start stands in as the legal address.
                    const bool qok = F == ARC_FORMAT_Q8_0 ? v0 + d + lane / 2 < units : first + d < units;
                    const bool qok2 = v0 + d + 16 + lane / 2 < units;  // Q8_0's second piece
                    const bool cok = lane < P::CHUNKS && cunit + d < units;
                    const uint32_t qa = qok ? qoff + QS * (uint32_t)d : 0u;
                    const uint32_t qa2 = qok2 ? qoff + 512u + QS * (uint32_t)d : 0u;
                    const uint32_t ca = !cok ? 0u
                                        : dchunk ? L.d + ((2u * (uint32_t)((v0 + d) / 8)) & ~15u)
                                                 : coff + cslope * (uint32_t)d;
#pragma unroll
                    for (int r = 0; r < NR; ++r) {
                        const uint32_t e = dst + (u * NR + r) * P::BYTES;
                        cp_async16(e + 16 * lane, crow[r] + qa, qok);
                        if constexpr (F == ARC_FORMAT_Q8_0) cp_async16(e + 512 + 16 * lane, crow[r] + qa2, qok2);
                        if constexpr (P::CHUNKS > 0) {
                            if (lane < P::CHUNKS) cp_async16(e + P::CHUNK_AT + 16 * lane, crow[r] + ca, cok);
                        }
                    }
                }
            }
            if (++cb == nb) {
                cb = 0;
                ++ct;
            }
            cs = cs + 1 == S ? 0 : cs + 1;
        }
        cp_async_commit();  // one group an item, empty past the last, so the wait below counts items
    };

    pdl_launch_dependents();
    if constexpr (!ROUTED) {  // weights no kernel writes: copied before the wait
        for (int i = 0; i < S - 1; ++i) copy_next();
    }
    pdl_wait();
    if constexpr (ROUTED) {  // seen by every thread after the staging's barrier
        stage_route(rt, route_ids, route_scale);
        if (!GATED && tid < rt.count) seg_ro[tid] = (long long)(rt.ids ? rt.ids[tid] : 0) * rows * L.bytes;
    }

    stage_input(x, cols, norm_w, eps, norm_add, HAND ? hand.in : nullptr, staged, dxs, sums, red);
    __syncthreads();
    if constexpr (ROUTED) {  // the rows and segments the route chose, read after the barrier
        for (int i = 0; i < S - 1; ++i) copy_next();
    }

    // The scale and min of a _K unit depend on its place j = u % 8 in the superblock, the same for
    // all of a lane's units (first + STEP * k, STEP a multiple of 32).
    const KSlot ks = k_slot(first % 8);
    ArgmaxSeen seen;  // AM: what this lane saw of the rows it wrote
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
    int mt = 0, mb = 0, ms = 0;  // the item multiplied: batch mb of task mt, in stage ms
    for (int i = 0; i < ntasks * nb; ++i) {
        __syncwarp();  // every lane is done reading the stage the next copy refills
        copy_next();
        cp_async_wait<S - 1>();
        __syncwarp();  // the item's chunks, copied by other lanes, are seen
        const uint8_t *item = ring + ms * ITEM;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int v = first + STEP * (mb * U + u);
            if (v < units) {
                const UnitInput in = qinput(staged, dxs, sums, v);
                const int at = P::WORD ? v % segu : v;
#pragma unroll
                for (int r = 0; r < NR; ++r) {
                    UnitRaw raw;
                    read_entry<F, SEGS>(item + (u * NR + r) * P::BYTES, lane, v, at, raw);
                    acc[r] += dot_unit<F>(raw, ks, in);
                }
            }
        }
        ms = ms + 1 == S ? 0 : ms + 1;
        if (++mb == nb) {
            mb = 0;
            gemv_finish_task<R, KS, GATED, AM>(acc, ((int)blockIdx.x + mt * (int)gridDim.x) * GROUPS + group, rows,
                                               bias, accumulate, y, seen, ROUTED && GATED ? route_scale : nullptr,
                                               rt.seg);
#pragma unroll
            for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
            ++mt;
        }
    }
    if constexpr (GATED && !ROUTED && HAND) {
        if (hand.out != nullptr && warp % KS == 0) quant_handoff<R, GROUPS>(y, rows, block_tasks, group, hand, lane);
    }
    if constexpr (AM) argmax_finish<GEMV_WARPS>(seen, am);
}

// What one quantized GEMV launch computes.
struct QgemvArgs {
    int format;
    const uint8_t *w;
    const float *x;
    int rows, cols;
    const uint16_t *bias, *norm_w;
    float eps;
    int accumulate;
    float *y;
    const GemvArgmax *am;
    float norm_add = 0.0f;  // what the norm adds to its weights (norm_plus_one: 1)
    const GemvRoute *route = nullptr;  // a mixture of experts' product (moe.cu)
    bool hand_out = false, hand_in = false;  // the SwiGLU GEMV's output to the handoff; the input from it
};

// Launches the instance (F, R, KS, GATED, AM, ROUTED, HAND) sized as the bf16 GEMV is: enough
// blocks for every SM at its occupancy limit, no more than there is work.
template <int F, int R, int KS, bool GATED, bool AM, bool ROUTED = false, bool HAND = false>
static int launch_qgemv_kernel(arc_context *ctx, const QgemvArgs &a) {
    auto kernel = qgemv_kernel<F, R, KS, GATED, AM, ROUTED, HAND>;
    const size_t smem = qgemv_smem<F, ROUTED && !GATED>(a.cols);
    int blocks = 0;
    ARC_TRY(gemv_blocks(ctx, kernel, smem, a.rows, R, KS, &blocks));
    const char *name = ROUTED ? "qgemv_kernel<routed>" : GATED ? "qgemv_kernel<swiglu>"
                                                      : AM ? "qgemv_kernel<argmax>" : "qgemv_kernel";
    return arc_launch_pdl(ctx, name, kernel, dim3(blocks), dim3(GEMV_THREADS), smem, a.w, a.x, a.rows, a.cols,
                          a.bias, a.norm_w, a.eps, a.norm_add, a.accumulate, a.y, a.am ? *a.am : GemvArgmax{},
                          a.route ? *a.route : GemvRoute{},
                          QuantHandoff{a.hand_out ? ctx->handoff : nullptr, ctx->handoff_done,
                                       a.hand_in ? ctx->handoff : nullptr});
}

template <int F, int R, int KS, bool GATED>
static int launch_qgemv_shape(arc_context *ctx, const QgemvArgs &a) {
    if constexpr (!GATED) {
        if (a.am) return launch_qgemv_kernel<F, R, KS, GATED, true>(ctx, a);
    }
    if (a.hand_in || a.hand_out) return launch_qgemv_kernel<F, R, KS, GATED, false, false, true>(ctx, a);
    return launch_qgemv_kernel<F, R, KS, GATED, false>(ctx, a);
}

// Picks (R, KS) for the shape, as the bf16 GEMV does over the row's 16-byte quant vectors, and
// launches format F's instance. GATED takes at most R = 2.
template <int F, bool GATED>
static int launch_qgemv_format(arc_context *ctx, const QgemvArgs &a) {
    constexpr int MAX_R = GATED ? 2 : 4;
    const int vectors = a.cols / QUNIT * (F == ARC_FORMAT_Q8_0 ? 2 : 1);
    int ks = 1;
    if (a.route) {  // a routed product: rows of 1 or 2 a task, no split over k
        const int r = gemv_split(ctx, a.rows, vectors, 2, GATED, &ks);
        return r == 2 ? launch_qgemv_kernel<F, 2, 1, GATED, false, true>(ctx, a)
                      : launch_qgemv_kernel<F, 1, 1, GATED, false, true>(ctx, a);
    }
    const int r = gemv_split(ctx, a.rows, vectors, MAX_R, GATED, &ks);
    if constexpr (MAX_R == 4) {
        if (r == 4) return launch_qgemv_shape<F, 4, 1, GATED>(ctx, a);
    }
    if (r == 2) return launch_qgemv_shape<F, 2, 1, GATED>(ctx, a);
    switch (ks) {
    case 8:
    case 4: return launch_qgemv_shape<F, 1, 4, GATED>(ctx, a);
    case 2: return launch_qgemv_shape<F, 1, 2, GATED>(ctx, a);
    default: return launch_qgemv_shape<F, 1, 1, GATED>(ctx, a);
    }
}

// The instances of a few formats each, compiled in their own files (qgemv_*.cu).
int launch_qgemv_q8_q4(arc_context *ctx, const QgemvArgs &a, bool gated);
int launch_qgemv_k(arc_context *ctx, const QgemvArgs &a, bool gated);
