// deltanet_rows.cu -- a DeltaNet layer over a chunk's rows in the form DN_ROWS (deltanet.cuh), made
// for the prefill: three launches whose arithmetic is the step's (deltanet_math.cuh), so that every
// row gets the bits the step gives it:
//   dn_prep_kernel, a block a (row, key head): the convolution of the key head's q and k channels and
//     of its value heads' v channels over the chunk's inputs (the slot's, for the inputs before the
//     chunk), q and k normalized, each value head's beta and decay: the row of the scratch;
//   dn_scan_kernel, a block a (value head, 32 of its columns), four warps of 8 columns: lane l holds
//     column 8 w + l % 8 of S for the 32 k of group l / 8, and the groups' parts are added by two
//     shuffles, so the rows' loop has no barrier; the next row's inputs load while a row runs. Each
//     row's o replaces its v in the scratch; S goes to the slot of the chunk's end;
//   dn_out_kernel, a block a (row, value head): the gated norm into att. The last row's blocks write
//     the convolution's last inputs to the slot of the chunk's end, after the prep has read the slot
//     of its start (the same slot where the chunk holds a multiple of DN_SLOTS rows).
// The step's form runs a row through five barriers of 512 threads one after another; this one runs
// the rows' inputs in parallel and leaves one warp's dependent arithmetic a row.
#include "deltanet_math.cuh"
#include "launch.cuh"

namespace {

constexpr int D = DN_HEAD_DIM;

struct RowsArgs {
    const float *u;  // DN_IN's rows, u_stride floats apart
    float *scratch;  // rows of scratch_row floats: q, k, v (then o) as u's channels, beta, decay
    int32_t u_stride, scratch_row, rows;
    int32_t first;  // the position of row 0
    const uint16_t *conv_w, *a_log, *dt_bias, *norm;
    float *state;
    uint64_t slot_floats;
    int32_t k_heads, v_heads, group, k_dim, v_dim, conv_dim, kernel;
    float eps;
    float *out;
    uint16_t *out_bf16;
};

__device__ __forceinline__ float *slot_at(const RowsArgs &a, int p) {
    return a.state + (size_t)(p % DN_SLOTS) * a.slot_floats;
}

// The input of channel ch at row r of the chunk; r < 0: before it, from the chunk's first slot
// (zeros at position 0).
__device__ __forceinline__ float conv_input(const RowsArgs &a, int ch, int r) {
    if (r >= 0) return a.u[(size_t)r * a.u_stride + ch];
    return a.first == 0 ? 0.0f : slot_at(a, a.first)[(size_t)ch * (a.kernel - 1) + (a.kernel - 1) + r];
}

template <int K>
__device__ __forceinline__ float conv_at(const RowsArgs &a, int ch, int r) {
    float w[K], hist[K - 1];
#pragma unroll
    for (int i = 0; i < K; ++i) w[i] = bf16_to_f32(a.conv_w[(size_t)ch * K + i]);
#pragma unroll
    for (int i = 0; i < K - 1; ++i) hist[i] = conv_input(a, ch, r - (K - 1) + i);
    return dn_conv<K>(w, hist, a.u[(size_t)r * a.u_stride + ch]);
}

// Launch: (rows, k_heads) blocks of D threads; thread t takes element t of q, k and each v.
template <int K>
__global__ void __launch_bounds__(D) dn_prep_kernel(RowsArgs a) {
    pdl_launch_dependents();
    const int r = blockIdx.x, kh = blockIdx.y, t = threadIdx.x, lane = t % 32, warp = t / 32;
    __shared__ float sums[2][D / 32];
    pdl_wait();  // u is the projection's output
    const float xq = conv_at<K>(a, kh * D + t, r), xk = conv_at<K>(a, a.k_dim + kh * D + t, r);
    const float sq = warp_sum(dn_square(xq)), sk = warp_sum(dn_square(xk));
    if (lane == 0) sums[0][warp] = sq, sums[1][warp] = sk;
    float *row = a.scratch + (size_t)r * a.scratch_row;
    for (int i = 0; i < a.group; ++i) {
        const int ch = 2 * a.k_dim + (kh * a.group + i) * D + t;
        row[ch] = conv_at<K>(a, ch, r);
    }
    if (t < a.group) {
        const int h = kh * a.group + t;
        const float *bu = a.u + (size_t)r * a.u_stride + a.conv_dim + a.v_dim;
        row[a.conv_dim + h] = dn_beta(bu[h]);
        row[a.conv_dim + a.v_heads + h] = dn_decay(bu[a.v_heads + h], a.a_log[h], a.dt_bias[h]);
    }
    __syncthreads();
    row[kh * D + t] = dn_unit(xq, dn_sum4(sums[0]), DN_Q_SCALE);
    row[a.k_dim + kh * D + t] = dn_unit(xk, dn_sum4(sums[1]), 1.0f);
}

// A row's inputs for one lane: q and k at its group's DN_PER k, v of its column, beta, the decay.
struct RowIn {
    float q[DN_PER], k[DN_PER], v, beta, decay;
};

// Launch: (v_heads, D / 32) blocks of D threads.
__global__ void __launch_bounds__(D) dn_scan_kernel(RowsArgs a) {
    pdl_launch_dependents();
    const int h = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 8;
    const int j = blockIdx.y * 32 + warp * 8 + lane % 8, kh = h / a.group;
    const size_t s_at = (size_t)a.conv_dim * (a.kernel - 1) + (size_t)h * D * D + (size_t)g * DN_PER * D + j;
    const int qk_at = kh * D + g * DN_PER, v_at = 2 * a.k_dim + h * D + j;
    pdl_wait();  // the scratch is the prep's
    float s[DN_PER];  // S[g * DN_PER + i][j]
    const float *s_in = slot_at(a, a.first) + s_at;
#pragma unroll
    for (int i = 0; i < DN_PER; ++i) s[i] = a.first == 0 ? 0.0f : s_in[(size_t)i * D];
    auto load = [&](int r, RowIn &x) {
        const float *row = a.scratch + (size_t)r * a.scratch_row;
        const float4 *q4 = (const float4 *)(row + qk_at), *k4 = (const float4 *)(row + a.k_dim + qk_at);
#pragma unroll
        for (int i = 0; i < DN_PER / 4; ++i) {
            const float4 q = q4[i], k = k4[i];
            x.q[4 * i] = q.x, x.q[4 * i + 1] = q.y, x.q[4 * i + 2] = q.z, x.q[4 * i + 3] = q.w;
            x.k[4 * i] = k.x, x.k[4 * i + 1] = k.y, x.k[4 * i + 2] = k.z, x.k[4 * i + 3] = k.w;
        }
        x.v = row[v_at];
        x.beta = row[a.conv_dim + h];
        x.decay = row[a.conv_dim + a.v_heads + h];
    };
    // The four groups' parts: lanes l, l ^ 8, l ^ 16 and l ^ 24 hold column j's.
    auto combine = [](float part) {
        part += __shfl_xor_sync(0xffffffffu, part, 8);
        return part + __shfl_xor_sync(0xffffffffu, part, 16);
    };
    RowIn cur, next;
    load(0, cur);
    for (int r = 0; r < a.rows; ++r) {
        if (r + 1 < a.rows) load(r + 1, next);
        const float o = dn_update(s, cur.k, cur.q, cur.v, cur.beta, cur.decay, combine);
        if (g == 0) a.scratch[(size_t)r * a.scratch_row + v_at] = o;  // every lane read this v a row ago
        cur = next;
    }
    float *s_out = slot_at(a, a.first + a.rows) + s_at;
#pragma unroll
    for (int i = 0; i < DN_PER; ++i) s_out[(size_t)i * D] = s[i];
}

// Launch: (rows, v_heads) blocks of D threads; thread t takes column t.
__global__ void __launch_bounds__(D) dn_out_kernel(RowsArgs a) {
    pdl_launch_dependents();
    const int r = blockIdx.x, h = blockIdx.y, t = threadIdx.x, lane = t % 32, warp = t / 32;
    __shared__ float sums[D / 32];
    const float w = bf16_to_f32(a.norm[t]);
    pdl_wait();  // o is the scan's
    const float o = a.scratch[(size_t)r * a.scratch_row + 2 * a.k_dim + h * D + t];
    const float oo = warp_sum(dn_square(o));
    if (lane == 0) sums[warp] = oo;
    __syncthreads();
    const float y = dn_gated_norm(o, dn_sum4(sums), a.eps, w, a.u[(size_t)r * a.u_stride + a.conv_dim + h * D + t]);
    const size_t at = (size_t)r * a.v_dim + (size_t)h * D + t;
    if (a.out_bf16) a.out_bf16[at] = f32_to_bf16(y);
    else a.out[at] = y;
    if (r != a.rows - 1) return;
    // The convolution's last inputs: v's by its head's blocks, q's and k's by the group's first head's.
    float *end = slot_at(a, a.first + a.rows);
    const int kh = h / a.group, n = h % a.group == 0 ? 3 : 1;
    const int chs[3] = {2 * a.k_dim + h * D + t, kh * D + t, a.k_dim + kh * D + t};
    for (int c = 0; c < n; ++c)
        for (int i = 0; i < a.kernel - 1; ++i)
            end[(size_t)chs[c] * (a.kernel - 1) + i] = conv_input(a, chs[c], a.rows - (a.kernel - 1) + i);
}

template <int K>
int launch_rows(arc_context *ctx, const RowsArgs &a) {
    ARC_TRY(arc_launch_pdl(ctx, "dn_prep_kernel", dn_prep_kernel<K>, dim3(a.rows, a.k_heads), dim3(D), 0, a));
    ARC_TRY(arc_launch_pdl(ctx, "dn_scan_kernel", dn_scan_kernel, dim3(a.v_heads, D / 32), dim3(D), 0, a));
    return arc_launch_pdl(ctx, "dn_out_kernel", dn_out_kernel, dim3(a.rows, a.v_heads), dim3(D), 0, a);
}

}  // namespace

int deltanet_rows(arc_context *ctx, const arc_model_config &c, const DeltaNetDims &d, const LayerParts &lw,
                  const DeltaNetIo &io) {
    ARC_REQUIRE(io.scratch && !io.pos && !io.every_state && io.rows >= DN_ROWS_MIN, "the rows' form takes a scratch, "
                "%d rows or more, a position from the host and keeps one state", DN_ROWS_MIN);
    const RowsArgs a{io.u, io.scratch, d.rows, d.scratch_row, io.rows, io.pos_add, lw.dn_conv, lw.dn_a_log,
                     lw.dn_dt_bias, lw.dn_norm, lw.dn_state, d.slot_floats, c.dn_k_heads, c.dn_v_heads,
                     c.dn_v_heads / c.dn_k_heads, d.k_dim, d.v_dim, d.conv_dim, c.dn_conv_kernel, c.rms_eps,
                     io.out, io.out_bf16};
    switch (c.dn_conv_kernel) {
    case 2: return launch_rows<2>(ctx, a);
    case 3: return launch_rows<3>(ctx, a);
    default: return launch_rows<4>(ctx, a);
    }
}
