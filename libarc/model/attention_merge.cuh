// attention_merge.cuh -- the last step of the decode's attention (attention.cu): the last block of a
// kv head to finish merges the partials its blocks wrote, in the same launch.
#pragma once

#include "attention_tile.cuh"

// The query heads h0..h0 + nh - 1, each over `parts` partials (rows `splits` apart): o_part[head][p][hd]
// = sum_t 2^(s_t - m_p) v_t and ml_part[head][p] = (m_p, l_p). Each head's maximum m over them, its
// sum l, and the weight 2^(m_p - m) / l of each part (a warp a head, its lanes holding the parts'
// (m, l), read once, in fw[head][part], shared memory of nh * parts floats), then out = the weighted
// sum of the parts' outputs, in part order. With sinks (AttnSpec::sinks) the weights are taken
// against top = max(m, sl) and l has the sink's term. VEC (hd % 4 == 0, o_part 16-byte aligned): a
// warp a head, a lane four consecutive elements, BATCH parts' loads in flight at once; else an
// element a thread. The sums are the same either way. Called by all of the block's WARPS warps.
template <bool VEC, int WARPS, int MAX_PARTS, int BATCH>
__device__ __forceinline__ void merge_parts(int nh, int h0, int hd, int splits, int parts,
                                            const float2 *__restrict__ ml_part, const float *__restrict__ o_part,
                                            const uint16_t *__restrict__ sinks, float *fw, float *__restrict__ out) {
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    constexpr int PER_LANE = MAX_PARTS / 32;
    for (int r = warp; r < nh; r += WARPS) {
        const float2 *st = ml_part + (size_t)(h0 + r) * splits;
        float2 v[PER_LANE];  // the lane's parts' (m, l), read once
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            v[i] = lane + 32 * i < parts ? __ldcg(&st[lane + 32 * i]) : make_float2(-INFINITY, 0.0f);
        float m = -INFINITY, l = 0.0f;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) m = fmaxf(m, v[i].x);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        const float sl = sinks ? sink_log2(sinks, h0 + r) : 0.0f, top = sinks ? fmaxf(m, sl) : m;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            if (lane + 32 * i < parts) l = fmaf(exp2f(v[i].x - top), v[i].y, l);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
        if (sinks) l += exp2f(sl - top);
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            if (lane + 32 * i < parts) fw[r * parts + lane + 32 * i] = exp2f(v[i].x - top) / l;
    }
    __syncthreads();
    if constexpr (VEC) {
        // A warp a head, a lane four consecutive elements, BATCH parts' loads in flight.
        for (int r = warp; r < nh; r += WARPS)
            for (int d = lane * 4; d < hd; d += 128) {
                const float *op = o_part + (size_t)(h0 + r) * splits * hd + d;
                const float *w = fw + r * parts;
                float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                for (int p0 = 0; p0 < parts; p0 += BATCH) {
                    float4 x[BATCH];
#pragma unroll
                    for (int i = 0; i < BATCH; ++i)
                        x[i] = p0 + i < parts ? __ldcg(reinterpret_cast<const float4 *>(op + (size_t)(p0 + i) * hd))
                                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                    for (int i = 0; i < BATCH; ++i)
                        if (p0 + i < parts) {
                            const float wi = w[p0 + i];
                            acc.x = fmaf(wi, x[i].x, acc.x);
                            acc.y = fmaf(wi, x[i].y, acc.y);
                            acc.z = fmaf(wi, x[i].z, acc.z);
                            acc.w = fmaf(wi, x[i].w, acc.w);
                        }
                }
                float *o = out + (size_t)(h0 + r) * hd + d;
                o[0] = acc.x, o[1] = acc.y, o[2] = acc.z, o[3] = acc.w;
            }
    } else {
        for (int e = tid; e < nh * hd; e += WARPS * 32) {
            const int r = e / hd, d = e % hd;
            const float *op = o_part + (size_t)(h0 + r) * splits * hd + d;
            const float *w = fw + r * parts;
            float acc = 0.0f;
#pragma unroll 8
            for (int p = 0; p < parts; ++p) acc = fmaf(w[p], __ldcg(op + (size_t)p * hd), acc);
            out[(size_t)(h0 + r) * hd + d] = acc;
        }
    }
}
