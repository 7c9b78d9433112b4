// deltanet.cu -- the gated DeltaNet layer's step (ARC_OP_DN_STEP) and the attention's output gate
// (ARC_OP_ATTN_GATE); deltanet.cuh says what they compute and how the state's slots are kept.
//
// The step: one block a value head h, DN_THREADS threads. Thread t holds column j = t % 128 of the
// head's S for the 32 k of its group g = t / 128 in registers, loaded once a launch and written
// once a row where a state is kept; rows run one after another through the same registers. For
// each row:
//   the convolution: threads 0..383 each take one channel of the head's q, k (key head h / group)
//     and v: the taps over the kernel - 1 inputs before it and its own, then SiLU;
//   q and k L2-normalized (q times 1 / sqrt(128)); beta = sigmoid(b_h), e = exp(g_h);
//   S <- e S; kv_j = sum_k S[k][j] k_k; delta_j = beta (v_j - kv_j); S[k][j] += k_k delta_j;
//     o_j = sum_k S[k][j] q_k, the groups' parts added through shared memory;
//   att_j = o_j rsqrt(mean(o^2) + eps) w_j silu(z_j).
// This form (DN_HEAD_BLOCK) is the forwards'; deltanet.cuh names the others. The arithmetic is
// deltanet_math.cuh's, which every form shares: a row gets the same bits in each.
#include "deltanet.cuh"

#include "deltanet_math.cuh"
#include "launch.cuh"

enum { DN_THREADS = DN_GROUPS * DN_HEAD_DIM };

int dn_layer_count(const arc_model_config &c) {
    int n = 0;
    for (int l = 0; l < c.n_layers && l < 128; ++l) n += layer_dn(c, l);
    return n;
}

int dn_ordinal(const arc_model_config &c, int l) {
    int n = 0;
    for (int i = 0; i < l; ++i) n += layer_dn(c, i);
    return n;
}

int check_dn(const arc_model_config &c, const char *who) {
    ARC_REQUIRE_AS(who, c.attn_gate == 0 || c.attn_gate == 1, "config.attn_gate must be 0 or 1, got %d", c.attn_gate);
    ARC_REQUIRE_AS(who, c.dn_k_heads >= 0 && c.dn_v_heads >= 0 && c.dn_head_dim >= 0 && c.dn_conv_kernel >= 0,
                   "config: dn_k_heads, dn_v_heads, dn_head_dim and dn_conv_kernel must not be negative");
    bool any = false;
    for (int i = 0; i < 4; ++i) any |= c.dn_layers[i] != 0;
    if (!any) return ARC_OK;
    for (int l = c.n_layers; l < 128; ++l)
        ARC_REQUIRE_AS(who, !layer_dn(c, l), "config.dn_layers names layer %d of a model of %d layers", l,
                       c.n_layers);
    ARC_REQUIRE_AS(who, c.dn_k_heads > 0 && c.dn_v_heads > 0 && c.dn_head_dim > 0,
                   "config: a DeltaNet layer needs dn_k_heads, dn_v_heads and dn_head_dim > 0");
    ARC_REQUIRE_AS(who, c.dn_v_heads % c.dn_k_heads == 0, "config.dn_v_heads (%d) must be a multiple of dn_k_heads (%d)",
                   c.dn_v_heads, c.dn_k_heads);
    ARC_REQUIRE_AS(who, c.dn_conv_kernel >= 2, "config.dn_conv_kernel must be 2 or more, got %d", c.dn_conv_kernel);
    ARC_REQUIRE_AS(who, !c.post_norms, "config: post_norms and DeltaNet layers do not combine");
    return ARC_OK;
}

bool dn_replaces(int t) {
    switch (t) {
    case ARC_TENSOR_WQ: case ARC_TENSOR_WK: case ARC_TENSOR_WV: case ARC_TENSOR_BQ: case ARC_TENSOR_BK:
    case ARC_TENSOR_BV: case ARC_TENSOR_WO: case ARC_TENSOR_Q_NORM: case ARC_TENSOR_K_NORM:
    case ARC_TENSOR_ROPE_INV_FREQ: case ARC_TENSOR_WQ_GATE: case ARC_TENSOR_SINKS: case ARC_TENSOR_BO: return true;
    default: return false;
    }
}

void dn_table_shape(const arc_model_config &c, int t, int l, uint64_t *rows, uint64_t *cols) {
    const bool dn = layer_dn(c, l);
    if (t < ARC_TENSOR_DN_QKV || t > ARC_TENSOR_DN_OUT) {  // another tensor: the caller's shape, without the attention's
        if (dn && dn_replaces(t)) *rows = 0;
        return;
    }
    const uint64_t hd = c.dn_head_dim, k = (uint64_t)c.dn_k_heads * hd, v = (uint64_t)c.dn_v_heads * hd;
    const uint64_t conv = 2 * k + v, dim = c.dim;
    uint64_t r = 1, n = dim;
    switch (t) {
    case ARC_TENSOR_DN_QKV: r = conv; break;
    case ARC_TENSOR_DN_Z: r = v; break;
    case ARC_TENSOR_DN_B: case ARC_TENSOR_DN_A: r = c.dn_v_heads; break;
    case ARC_TENSOR_DN_CONV: r = conv; n = c.dn_conv_kernel; break;
    case ARC_TENSOR_DN_A_LOG: case ARC_TENSOR_DN_DT_BIAS: n = c.dn_v_heads; break;
    case ARC_TENSOR_DN_NORM: n = hd; break;
    case ARC_TENSOR_DN_OUT: r = dim; n = v; break;
    default: break;
    }
    *rows = dn ? r : 0;
    *cols = n;
}

DeltaNetDims dn_dims(const arc_model_config &c, int32_t q_dim, int32_t qkv_rows) {
    DeltaNetDims d = {};
    d.att_dim = q_dim;
    d.qkv_alloc = qkv_rows;
    if (!dn_layer_count(c)) return d;
    d.k_dim = c.dn_k_heads * c.dn_head_dim;
    d.v_dim = c.dn_v_heads * c.dn_head_dim;
    d.conv_dim = 2 * d.k_dim + d.v_dim;
    d.rows = d.conv_dim + d.v_dim + 2 * c.dn_v_heads;
    d.att_dim = d.v_dim > q_dim ? d.v_dim : q_dim;
    d.qkv_alloc = d.rows > qkv_rows ? d.rows : qkv_rows;
    d.scratch_row = (d.conv_dim + 2 * c.dn_v_heads + 3) / 4 * 4;
    d.slot_floats = (uint64_t)d.conv_dim * (c.dn_conv_kernel - 1) +
                    (uint64_t)c.dn_v_heads * c.dn_head_dim * c.dn_head_dim;
    return d;
}

// Launch: v_heads blocks of DN_THREADS. K: the convolution's taps (2..DN_MAX_KERNEL).
template <int K>
__global__ void __launch_bounds__(DN_THREADS, 1) deltanet_kernel(DnArgs a) {
    pdl_launch_dependents();
    constexpr int D = DN_HEAD_DIM;
    const int h = blockIdx.x, kh = h / a.group, tid = threadIdx.x, j = tid % D, g = tid / D;
    const int lane = tid % 32, warp = tid / 32;
    __shared__ float qs[D], ks[D], vs[D], red[2][DN_GROUPS][D], sums[2][DN_THREADS / 32], gates[2];
    // The convolution channel of this thread: q, k of key head kh, v of value head h (-1: none).
    int ch = -1;
    if (tid < D) ch = kh * D + tid;
    else if (tid < 2 * D) ch = a.k_dim + kh * D + (tid - D);
    else if (tid < 3 * D) ch = 2 * a.k_dim + h * D + (tid - 2 * D);
    // Its conv state is written by one block: v by its head's, q and k by the first of the group's.
    const bool owns = ch >= 0 && (tid >= 2 * D || h % a.group == 0);
    float w[K];
#pragma unroll
    for (int i = 0; i < K; ++i) w[i] = ch >= 0 ? bf16_to_f32(a.conv_w[(size_t)ch * K + i]) : 0.0f;
    const float nw = bf16_to_f32(a.norm[j]);
    const size_t conv_floats = (size_t)a.conv_dim * (K - 1);

    // The position and the state it reads: before the wait where `early` (DeltaNetIo), else after.
    int p0 = 0;
    float hist[K - 1];  // the inputs at p - K + 1..p - 1, oldest first
    float s[DN_PER];    // S[g * DN_PER + i][j]
    auto load_state = [&] {
        p0 = (a.pos ? *a.pos : 0) + a.pos_add;
        const bool fresh = p0 == 0;
        const float *in = a.state + (size_t)(p0 % DN_SLOTS) * a.slot_floats;
#pragma unroll
        for (int i = 0; i < K - 1; ++i) hist[i] = (ch >= 0 && !fresh) ? in[(size_t)ch * (K - 1) + i] : 0.0f;
        const float *s_in = in + conv_floats + (size_t)h * D * D + (size_t)g * DN_PER * D + j;
#pragma unroll
        for (int i = 0; i < DN_PER; ++i) s[i] = fresh ? 0.0f : s_in[(size_t)i * D];
    };
    if (a.early) load_state();
    pdl_wait();  // u is the projection's output
    if (!a.early) load_state();

    // The four groups' parts of a sum over k, through shared memory: a row's two sums in two buffers,
    // each read before barriers that come ahead of its next row's write.
    int use = 0;
    auto combine = [&](float part) {
        float(*parts)[D] = red[use];
        use ^= 1;
        parts[g][j] = part;
        __syncthreads();
        return (parts[0][j] + parts[1][j]) + (parts[2][j] + parts[3][j]);
    };
    for (int r = 0; r < a.rows; ++r) {
        const float *u = a.u + (size_t)r * a.u_stride;
        float x = 0.0f;
        if (ch >= 0) {
            const float now = u[ch];
            x = dn_conv<K>(w, hist, now);
            dn_push<K>(hist, now);
        }
        // The squares of q (warps 0..3) and of k (warps 4..7).
        const float sq = warp_sum(tid < 2 * D ? dn_square(x) : 0.0f);
        if (lane == 0) sums[0][warp] = sq;
        __syncthreads();
        if (tid < D) {
            qs[tid] = dn_unit(x, dn_sum4(&sums[0][0]), DN_Q_SCALE);
        } else if (tid < 2 * D) {
            ks[tid - D] = dn_unit(x, dn_sum4(&sums[0][D / 32]), 1.0f);
        } else if (tid < 3 * D) {
            vs[tid - 2 * D] = x;
        } else if (tid == 3 * D) {
            const float *bu = u + a.conv_dim + a.v_dim;
            gates[0] = dn_beta(bu[h]);
            gates[1] = dn_decay(bu[a.v_heads + h], a.a_log[h], a.dt_bias[h]);
        }
        __syncthreads();
        const float o = dn_update(s, ks + g * DN_PER, qs + g * DN_PER, vs[j], gates[0], gates[1], combine);
        // The gated norm over the head's outputs (group 0's threads, warps 0..3).
        const float oo = warp_sum(g == 0 ? dn_square(o) : 0.0f);
        if (lane == 0) sums[1][warp] = oo;
        __syncthreads();
        if (g == 0) {
            const float y = dn_gated_norm(o, dn_sum4(&sums[1][0]), a.eps, nw, u[a.conv_dim + h * D + j]);
            const size_t at = (size_t)r * a.v_dim + (size_t)h * D + j;
            if (a.out_bf16) a.out_bf16[at] = f32_to_bf16(y);
            else a.out[at] = y;
        }
        if (a.every_state || r == a.rows - 1) {
            float *slot = a.state + (size_t)((p0 + r + 1) % DN_SLOTS) * a.slot_floats;
            float *s_out = slot + conv_floats + (size_t)h * D * D + (size_t)g * DN_PER * D + j;
#pragma unroll
            for (int i = 0; i < DN_PER; ++i) s_out[(size_t)i * D] = s[i];
            if (owns)
#pragma unroll
                for (int i = 0; i < K - 1; ++i) slot[(size_t)ch * (K - 1) + i] = hist[i];
        }
    }
}

int deltanet_layer(arc_context *ctx, const arc_model_config &c, const DeltaNetDims &d, const LayerParts &lw,
                   const DeltaNetIo &io) {
    ARC_REQUIRE(lw.dn && lw.dn_state, "not a DeltaNet layer");
    ARC_REQUIRE(io.u && (io.out || io.out_bf16) && io.rows > 0, "null buffer or no rows");
    ARC_REQUIRE(!io.every_state || io.rows < DN_SLOTS, "%d rows keep their states in %d slots", io.rows, DN_SLOTS);
    ARC_REQUIRE(c.dn_head_dim == DN_HEAD_DIM, "dn_head_dim must be %d, got %d", DN_HEAD_DIM, c.dn_head_dim);
    ARC_REQUIRE(c.dn_conv_kernel >= 2 && c.dn_conv_kernel <= DN_MAX_KERNEL, "dn_conv_kernel must be in [2, %d], got %d",
                DN_MAX_KERNEL, c.dn_conv_kernel);
    ARC_REQUIRE(io.form >= DN_HEAD_BLOCK && io.form <= DN_ROWS, "form must be 0, 1 or 2, got %d", (int)io.form);
    ARC_REQUIRE(io.form != DN_CLUSTER || ctx->cc_major >= 9, "the clusters' form needs compute capability 9.0 or "
                "more, the device has %d.x", ctx->cc_major);
    if (io.form == DN_ROWS) return deltanet_rows(ctx, c, d, lw, io);
    const DnArgs a{io.u, d.rows, io.rows, io.pos, io.pos_add, io.every_state ? 1 : 0, io.early ? 1 : 0,
                   lw.dn_conv, lw.dn_a_log, lw.dn_dt_bias, lw.dn_norm, lw.dn_state, d.slot_floats, c.dn_v_heads,
                   c.dn_v_heads / c.dn_k_heads, d.k_dim, d.v_dim, d.conv_dim, c.rms_eps, io.out, io.out_bf16};
    if (io.form == DN_CLUSTER) return deltanet_cluster(ctx, c.dn_conv_kernel, a);
    const dim3 grid(c.dn_v_heads), block(DN_THREADS);
    switch (c.dn_conv_kernel) {
    case 2: return arc_launch_pdl(ctx, "deltanet_kernel", deltanet_kernel<2>, grid, block, 0, a);
    case 3: return arc_launch_pdl(ctx, "deltanet_kernel", deltanet_kernel<3>, grid, block, 0, a);
    default: return arc_launch_pdl(ctx, "deltanet_kernel", deltanet_kernel<4>, grid, block, 0, a);
    }
}

// The ops' layer (arc_op_deltanet_step, arc_op_deltanet_rows): one layer's weights and slots.
static int op_layer(const char *who, const arc_model_config &c, const uint16_t *conv, const uint16_t *a_log,
                    const uint16_t *dt_bias, const uint16_t *norm, float *state, LayerParts *lw) {
    ARC_REQUIRE_AS(who, c.dn_k_heads > 0 && c.dn_v_heads > 0 && c.dn_v_heads % c.dn_k_heads == 0,
                   "config: dn_v_heads (%d) must be a positive multiple of dn_k_heads (%d)", c.dn_v_heads,
                   c.dn_k_heads);
    *lw = LayerParts{};
    lw->dn = true;
    lw->dn_conv = conv, lw->dn_a_log = a_log, lw->dn_dt_bias = dt_bias, lw->dn_norm = norm, lw->dn_state = state;
    return ARC_OK;
}

extern "C" int arc_op_deltanet_step(arc_context *ctx, const arc_model_config *config, const float *u,
                                    const int32_t *pos, const uint16_t *conv, const uint16_t *a_log,
                                    const uint16_t *dt_bias, const uint16_t *norm, float *state, float *out) {
    ARC_REQUIRE(ctx && config && u && pos && conv && a_log && dt_bias && norm && state && out, "null argument");
    LayerParts lw;
    ARC_TRY(op_layer(__func__, *config, conv, a_log, dt_bias, norm, state, &lw));
    return deltanet_layer(ctx, *config, dn_dims(*config, 0, 0), lw,
                          {.u = u, .rows = 1, .pos = pos, .early = true, .out = out});
}

extern "C" int arc_op_deltanet_rows(arc_context *ctx, const arc_model_config *config, int32_t form, const float *u,
                                    int32_t rows, int32_t pos, const uint16_t *conv, const uint16_t *a_log,
                                    const uint16_t *dt_bias, const uint16_t *norm, float *state, float *scratch,
                                    float *out) {
    ARC_REQUIRE(ctx && config && u && conv && a_log && dt_bias && norm && state && out, "null argument");
    ARC_REQUIRE(form != DN_ROWS || scratch, "the rows' form (2) takes a scratch");
    ARC_REQUIRE(pos >= 0 && rows > 0 && (rows >= DN_ROWS_MIN || form != DN_ROWS),
                "pos must not be negative and rows positive (%d or more in the rows' form), got %d and %d",
                DN_ROWS_MIN, pos, rows);
    LayerParts lw;
    ARC_TRY(op_layer(__func__, *config, conv, a_log, dt_bias, norm, state, &lw));
    return deltanet_layer(ctx, *config, dn_dims(*config, 0, 0), lw,
                          {.u = u, .rows = rows, .pos_add = pos, .out = out, .form = (DnForm)form, .scratch = scratch});
}

enum { GATE_THREADS = 256 };

template <bool BF16>
__global__ void __launch_bounds__(GATE_THREADS) attn_gate_kernel(float *att, uint16_t *att_bf16, const float *gate,
                                                                 int gate_stride, int rows, int n) {
    pdl_launch_dependents();
    pdl_wait();  // att and the gate are this step's
    const int64_t i = (int64_t)blockIdx.x * GATE_THREADS + threadIdx.x;
    if (i >= (int64_t)rows * n) return;
    const int r = (int)(i / n), e = (int)(i % n);
    const float sg = dn_sigmoid(gate[(size_t)r * gate_stride + e]);
    if (BF16) att_bf16[i] = f32_to_bf16(bf16_to_f32(att_bf16[i]) * sg);
    else att[i] = att[i] * sg;
}

int launch_attn_gate(arc_context *ctx, float *att, uint16_t *att_bf16, const float *gate, int32_t gate_stride,
                     int32_t rows, int32_t n) {
    ARC_REQUIRE((att || att_bf16) && gate && rows > 0 && n > 0 && gate_stride >= n, "null buffer or bad shape");
    const int64_t total = (int64_t)rows * n;
    const dim3 grid((unsigned)((total + GATE_THREADS - 1) / GATE_THREADS)), block(GATE_THREADS);
    if (att_bf16)
        return arc_launch_pdl(ctx, "attn_gate_kernel", attn_gate_kernel<true>, grid, block, 0, att, att_bf16, gate,
                              (int)gate_stride, (int)rows, (int)n);
    return arc_launch_pdl(ctx, "attn_gate_kernel", attn_gate_kernel<false>, grid, block, 0, att, att_bf16, gate,
                          (int)gate_stride, (int)rows, (int)n);
}
