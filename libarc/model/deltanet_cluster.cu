// deltanet_cluster.cu -- the DeltaNet step in the form DN_CLUSTER (deltanet.cuh; compute capability
// 9.0 or more), made for the decode and the verify: a value head's S over the four blocks of one
// cluster, 32 columns a block, so that four times as many multiprocessors stream the state as with
// deltanet_kernel's block a head (deltanet.cu). The arithmetic is deltanet_math.cuh's, so a row's
// bits are the other forms':
//   each block makes the row's q and k of its key head (thread t: element t) and the v of its 32
//   columns; its four warps hold 8 columns of S each for the four groups of k (lane l: column
//   8 w + l % 8, group l / 8), the groups' parts added by shuffles;
//   the head's sum of o^2: each block's warp sum over its 32 columns, which the four blocks read from
//   each other's shared memory after a cluster barrier, in block order.
#include <cooperative_groups.h>

#include "deltanet_math.cuh"
#include "launch.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int D = DN_HEAD_DIM, COLS = 32, PARTS = D / COLS;

// Launch: v_heads * PARTS blocks of D threads in clusters of PARTS (block x: head x / PARTS, its
// columns 32 (x % PARTS) ..).
template <int K>
__global__ void __launch_bounds__(D) dn_cluster_kernel(DnArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // clusters: the host launches it from 9.0 on alone
    pdl_launch_dependents();
    cg::cluster_group cluster = cg::this_cluster();
    const int h = blockIdx.x / PARTS, part = blockIdx.x % PARTS, kh = h / a.group;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 8, jl = warp * 8 + lane % 8;
    __shared__ float qs[D], ks[D], vs[COLS], os[COLS], sums[2][D / 32], gates[2], oo[2];
    // Thread t's channels: q and k element t of key head kh; v of column 32 part + t (t < 32).
    const int cq = kh * D + t, ck = a.k_dim + kh * D + t, cv = 2 * a.k_dim + h * D + part * COLS + t;
    const bool has_v = t < COLS, owns_qk = h % a.group == 0 && part == 0;
    float wq[K], wk[K], wv[K];
#pragma unroll
    for (int i = 0; i < K; ++i) {
        wq[i] = bf16_to_f32(a.conv_w[(size_t)cq * K + i]);
        wk[i] = bf16_to_f32(a.conv_w[(size_t)ck * K + i]);
        wv[i] = has_v ? bf16_to_f32(a.conv_w[(size_t)cv * K + i]) : 0.0f;
    }
    const float nw = has_v ? bf16_to_f32(a.norm[part * COLS + t]) : 0.0f;
    const size_t s_at = (size_t)a.conv_dim * (K - 1) + (size_t)h * D * D + (size_t)g * DN_PER * D + part * COLS + jl;

    // The position and the state it reads: before the wait where `early` (DeltaNetIo), else after.
    int p0 = 0;
    float hq[K - 1], hk[K - 1], hv[K - 1], s[DN_PER];  // s[i]: S[g * DN_PER + i][32 part + jl]
    auto load_state = [&] {
        p0 = (a.pos ? *a.pos : 0) + a.pos_add;
        const bool fresh = p0 == 0;
        const float *in = a.state + (size_t)(p0 % DN_SLOTS) * a.slot_floats;
#pragma unroll
        for (int i = 0; i < K - 1; ++i) {
            hq[i] = fresh ? 0.0f : in[(size_t)cq * (K - 1) + i];
            hk[i] = fresh ? 0.0f : in[(size_t)ck * (K - 1) + i];
            hv[i] = fresh || !has_v ? 0.0f : in[(size_t)cv * (K - 1) + i];
        }
#pragma unroll
        for (int i = 0; i < DN_PER; ++i) s[i] = fresh ? 0.0f : in[s_at + (size_t)i * D];
    };
    if (a.early) load_state();
    pdl_wait();  // u is the projection's output
    if (!a.early) load_state();

    for (int r = 0; r < a.rows; ++r) {
        const float *u = a.u + (size_t)r * a.u_stride;
        const float nq = u[cq], nk = u[ck], nv = has_v ? u[cv] : 0.0f;
        const float xq = dn_conv<K>(wq, hq, nq), xk = dn_conv<K>(wk, hk, nk), xv = dn_conv<K>(wv, hv, nv);
        dn_push<K>(hq, nq), dn_push<K>(hk, nk), dn_push<K>(hv, nv);
        const float sq = warp_sum(dn_square(xq)), sk = warp_sum(dn_square(xk));
        if (lane == 0) sums[0][warp] = sq, sums[1][warp] = sk;
        __syncthreads();
        qs[t] = dn_unit(xq, dn_sum4(sums[0]), DN_Q_SCALE);
        ks[t] = dn_unit(xk, dn_sum4(sums[1]), 1.0f);
        if (has_v) vs[t] = xv;
        if (t == COLS) {
            const float *bu = u + a.conv_dim + a.v_dim;
            gates[0] = dn_beta(bu[h]);
            gates[1] = dn_decay(bu[a.v_heads + h], a.a_log[h], a.dt_bias[h]);
        }
        __syncthreads();
        // The groups' parts of a column: lanes l, l ^ 8, l ^ 16 and l ^ 24.
        const float o = dn_update(s, ks + g * DN_PER, qs + g * DN_PER, vs[jl], gates[0], gates[1], [](float p) {
            p += __shfl_xor_sync(0xffffffffu, p, 8);
            return p + __shfl_xor_sync(0xffffffffu, p, 16);
        });
        if (g == 0) os[jl] = o;
        __syncthreads();
        if (warp == 0) {
            const float ss = warp_sum(dn_square(os[lane]));
            if (lane == 0) oo[r & 1] = ss;  // read by the cluster until its barrier a row later
        }
        cluster.sync();
        if (has_v) {
            float p[PARTS];
#pragma unroll
            for (int b = 0; b < PARTS; ++b) p[b] = *cluster.map_shared_rank(&oo[r & 1], b);
            const int col = h * D + part * COLS + t;
            const float y = dn_gated_norm(os[t], dn_sum4(p), a.eps, nw, u[a.conv_dim + col]);
            const size_t at = (size_t)r * a.v_dim + col;
            if (a.out_bf16) a.out_bf16[at] = f32_to_bf16(y);
            else a.out[at] = y;
        }
        if (a.every_state || r == a.rows - 1) {
            float *slot = a.state + (size_t)((p0 + r + 1) % DN_SLOTS) * a.slot_floats;
#pragma unroll
            for (int i = 0; i < DN_PER; ++i) slot[s_at + (size_t)i * D] = s[i];
#pragma unroll
            for (int i = 0; i < K - 1; ++i) {
                if (owns_qk) slot[(size_t)cq * (K - 1) + i] = hq[i], slot[(size_t)ck * (K - 1) + i] = hk[i];
                if (has_v) slot[(size_t)cv * (K - 1) + i] = hv[i];
            }
        }
    }
    cluster.sync();  // no block leaves while another may still read its oo
#endif
}

}  // namespace

int deltanet_cluster(arc_context *ctx, int conv_kernel, const DnArgs &a) {
    const dim3 grid(a.v_heads * PARTS), block(D);
    switch (conv_kernel) {
    case 2: return arc_launch_ex(ctx, "dn_cluster_kernel", dn_cluster_kernel<2>, grid, block, 0, PARTS, a);
    case 3: return arc_launch_ex(ctx, "dn_cluster_kernel", dn_cluster_kernel<3>, grid, block, 0, PARTS, a);
    default: return arc_launch_ex(ctx, "dn_cluster_kernel", dn_cluster_kernel<4>, grid, block, 0, PARTS, a);
    }
}
