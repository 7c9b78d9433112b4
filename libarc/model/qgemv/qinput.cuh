// qinput.cuh -- the quantized GEMV's input (qgemv.cuh): each unit of 32 values as int8 with its
// scale and the sums of its halves, staged in every block's shared memory, or handed over.
//
// Staging: the fused RMSNorm applied as the bf16 GEMV applies it, then every unit quantized
// (arc.h: amax, x_q = rint(x * 127 / amax), dx = amax / 127) with the sums of its two halves.
// Eight threads take a unit, four values each, so staging needs few registers and no second pass.
//
// The handoff: the SwiGLU GEMV can write its output h a second time, quantized in the staging's
// layout, so that the down GEMV copies it instead of staging h itself (the longest staging: the
// FFN's width). Each warp, once it wrote all its rows, takes a ticket for each of its tasks in the
// task's unit of 32 rows; the warp that completes a unit quantizes it with the staging's
// arithmetic, so the down GEMV's input is the same bits either way (quant_handoff).
#pragma once

#include "model/gemv/gemv_common.cuh"
#include "quant.cuh"

// Shared memory of the staged input, per unit: 32 int8 values, the two half sums and dx; in
// units * 32 bytes of int8 words, then units int2 sums, then units floats dx (every array aligned
// for any number of units). The handoff holds the same bytes (arc_context.handoff).
constexpr size_t QGEMV_STAGE_BYTES = 32 + 8 + 4;
static_assert(QGEMV_STAGE_BYTES == ARC_HANDOFF_UNIT_BYTES && ARC_HANDOFF_UNITS * QUNIT == GEMV_MAX_COLS,
              "the handoff holds one staged input of the widest GEMV");

// A launch's part in the handoff: `out` and `done` (the SwiGLU GEMV, rows % 128 == 0) to write
// its output quantized; `in` (a GEMV without a norm, cols % 128 == 0) to read its input so.
struct QuantHandoff {
    uint8_t *out;
    uint32_t *done;
    const uint8_t *in;
};

// Unit `unit` of y (rows values) quantized into h.out as the staging quantizes it: amax of the 32
// values, q = rint(v * 127 / amax) clamped to 127, dx = amax / 127, the sums of each half's q.
// A whole warp calls this, after every writer of the unit's rows fenced and took its ticket.
__device__ __forceinline__ void handoff_unit(const float *y, int unit, int rows, const QuantHandoff &h, int lane) {
    const int units = rows / QUNIT;
    const float v = __ldcg(y + QUNIT * unit + lane);
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int q = max(-127, min(127, __float2int_rn(v * scale)));
    uint32_t word = (uint32_t)(q & 0xff) << (8 * (lane % 4));  // value 4i + b in byte b of word i
    word |= __shfl_xor_sync(0xffffffffu, word, 1);
    word |= __shfl_xor_sync(0xffffffffu, word, 2);
    int sum = q;
#pragma unroll
    for (int o = 1; o < 16; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);  // each half's
    const int second = __shfl_sync(0xffffffffu, sum, 16);
    if (lane % 4 == 0) reinterpret_cast<uint32_t *>(h.out)[8 * unit + lane / 4] = word;
    if (lane == 0) {
        reinterpret_cast<int2 *>(h.out + 32 * units)[unit] = make_int2(sum, second);
        reinterpret_cast<float *>(h.out + 40 * units)[unit] = amax / 127.0f;
        h.done[unit] = 0;  // the ticket, ready for the next launch
    }
}

// After a warp of the SwiGLU GEMV wrote all its tasks' rows (lane 0 writes them; tasks
// (blockIdx.x + i * gridDim.x) * GROUPS + group, R rows each): one fence, a ticket for each task
// in its unit of 32 rows (lane i takes the i-th task's, all at once), and every unit whose last
// ticket this warp took quantized by it (handoff_unit). A whole warp calls this.
template <int R, int GROUPS>
__device__ __forceinline__ void quant_handoff(const float *y, int rows, int block_tasks, int group,
                                              const QuantHandoff &h, int lane) {
    if ((int)blockIdx.x >= block_tasks) return;
    __threadfence();  // lane 0's rows reach every SM before any of its tickets does
    const int n = (block_tasks - 1 - (int)blockIdx.x) / (int)gridDim.x + 1;  // the warp's tasks
    for (int i0 = 0; i0 < n; i0 += 32) {
        const int task = ((int)blockIdx.x + (i0 + lane) * (int)gridDim.x) * GROUPS + group;
        bool last = false;
        if (i0 + lane < n && task * R < rows) last = atomicAdd(h.done + task * R / QUNIT, 1u) == QUNIT / R - 1;
        uint32_t mine = __ballot_sync(0xffffffffu, last);
        if (mine) __threadfence();  // the other writers' rows, seen after their tickets
        while (mine) {
            const int l = __ffs(mine) - 1;
            mine &= mine - 1;
            handoff_unit(y, __shfl_sync(0xffffffffu, task, l) * R / QUNIT, rows, h, lane);
        }
    }
}

// The quantized input of unit v, from the staging.
__device__ __forceinline__ UnitInput qinput(const int4 *staged, const float *dxs, const int2 *sums, int v) {
    UnitInput in;
    in.xa = staged[2 * v];
    in.xb = staged[2 * v + 1];
    in.dx = dxs[v];
    const int2 s = sums[v];
    in.s0 = s.x;
    in.s1 = s.y;
    return in;
}

// The block's staged input: from the handoff (`handed`, with no norm), or x normed with norm_w
// (if any) and quantized. Every thread of the block calls this; a barrier must follow before use.
__device__ __forceinline__ void stage_input(const float *__restrict__ x, int cols, const uint16_t *__restrict__ norm_w,
                                            float eps, float norm_add, const uint8_t *handed, int4 *staged,
                                            float *dxs, int2 *sums, float *red) {
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, units = cols / QUNIT;
    if (handed != nullptr) {  // the input as the handoff holds it, already quantized
        // Every load of a pass in flight before any store (units * 44 bytes: 5 int4 a thread at 14,336).
        const int4 *src = reinterpret_cast<const int4 *>(handed);
        const int n = units * (int)QGEMV_STAGE_BYTES / 16;
        for (int i0 = tid; i0 < n; i0 += GEMV_THREADS * 8) {
            int4 v[8];
#pragma unroll
            for (int k = 0; k < 8; ++k)
                if (i0 + k * GEMV_THREADS < n) v[k] = __ldcg(src + i0 + k * GEMV_THREADS);
#pragma unroll
            for (int k = 0; k < 8; ++k)
                if (i0 + k * GEMV_THREADS < n) staged[i0 + k * GEMV_THREADS] = v[k];
        }
    } else {
        // The input: the norm's scale first (every block sums the squares in the same order as the
        // bf16 GEMV's staging), then each unit quantized by 8 threads, 4 values each.
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        float inv = 1.0f;
        if (norm_w != nullptr) {
            float ss = 0.0f;
            for (int v0 = tid; v0 < cols / 8; v0 += GEMV_THREADS * GEMV_STAGE) {
                float4 a[GEMV_STAGE], b[GEMV_STAGE];  // every load in flight before any use
#pragma unroll
                for (int k = 0; k < GEMV_STAGE; ++k) {
                    const int v = v0 + k * GEMV_THREADS;
                    a[k] = b[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    if (v < cols / 8) {
                        a[k] = x4[2 * v];
                        b[k] = x4[2 * v + 1];
                    }
                }
#pragma unroll
                for (int k = 0; k < GEMV_STAGE; ++k) {
                    ss += a[k].x * a[k].x + a[k].y * a[k].y + a[k].z * a[k].z + a[k].w * a[k].w;
                    ss += b[k].x * b[k].x + b[k].y * b[k].y + b[k].z * b[k].z + b[k].w * b[k].w;
                }
            }
            inv = rsqrtf(block_sum(ss, red) / (float)cols + eps);
        }
        const int part = tid % 8;  // the unit's values 4 * part .. 4 * part + 3
        int *words = reinterpret_cast<int *>(staged);
        constexpr int PER = GEMV_THREADS / 8;  // units a block pass covers
        for (int base = warp * 4; base < units; base += PER * GEMV_STAGE) {
            // A warp's units advance together, so the shuffles below always have all 32 lanes; the
            // loads of GEMV_STAGE passes are all in flight before any is used.
            float4 v[GEMV_STAGE];
            uint2 g[GEMV_STAGE];
#pragma unroll
            for (int k = 0; k < GEMV_STAGE; ++k) {
                const int u0 = base + k * PER + lane / 8, u = u0 < units ? u0 : units - 1;
                v[k] = x4[8 * u + part];
                if (norm_w != nullptr) g[k] = *reinterpret_cast<const uint2 *>(norm_w + 32 * u + 4 * part);
            }
#pragma unroll
            for (int k = 0; k < GEMV_STAGE; ++k) {
                const int u0 = base + k * PER + lane / 8;
                if (norm_w != nullptr) {
                    v[k].x = v[k].x * inv * (norm_add + bf16_lo(g[k].x));
                    v[k].y = v[k].y * inv * (norm_add + bf16_hi(g[k].x));
                    v[k].z = v[k].z * inv * (norm_add + bf16_lo(g[k].y));
                    v[k].w = v[k].w * inv * (norm_add + bf16_hi(g[k].y));
                }
                float amax = fmaxf(fmaxf(fabsf(v[k].x), fabsf(v[k].y)), fmaxf(fabsf(v[k].z), fabsf(v[k].w)));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
                const float scale = amax > 0.0f ? 127.0f / amax : 0.0f;
                const int q0 = max(-127, min(127, __float2int_rn(v[k].x * scale)));
                const int q1 = max(-127, min(127, __float2int_rn(v[k].y * scale)));
                const int q2 = max(-127, min(127, __float2int_rn(v[k].z * scale)));
                const int q3 = max(-127, min(127, __float2int_rn(v[k].w * scale)));
                int sum = q0 + q1 + q2 + q3;
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);  // lanes 0-3 of the 8: the first half's sum
                const int other = __shfl_xor_sync(0xffffffffu, sum, 4);
                if (u0 < units) {
                    words[8 * u0 + part] = (q0 & 0xff) | (q1 & 0xff) << 8 | (q2 & 0xff) << 16 | (q3 & 0xff) << 24;
                    if (part == 0) {
                        dxs[u0] = amax / 127.0f;
                        sums[u0] = make_int2(sum, other);
                    }
                }
            }
        }
    }
}
