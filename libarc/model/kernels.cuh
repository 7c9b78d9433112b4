// kernels.cuh -- what the forward's kernels share: bf16 conversions, warp and block reductions,
// and the launch helper. Each kernel's launcher is its arc_op_* entry point, which
// arc_model_forward calls too, so the kernel tests exercise exactly what the forward runs.
//
// Every launcher takes the context (it enqueues on ctx->stream), checks its limits with
// ARC_REQUIRE, launches, and checks the launch with ARC_LAUNCHED. Token and position are read
// on the device from the pointers given, never passed by value, so a captured graph replays
// unchanged at every position.
#pragma once

#include <math.h>
#include <stdint.h>

#include "internal.cuh"

// bf16 is the top half of a float32: widening is exact.
__device__ __forceinline__ float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }
__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// Round to nearest, ties to even; a NaN stays a quiet NaN (rounding must not carry it into inf).
__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// Sum over the block; every thread gets the same value (each sums the warp partials in the
// same order). Contains __syncthreads: call it from every thread of the block. `scratch` holds
// one float per warp.
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = (blockDim.x + 31) / 32;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by an earlier call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < nwarps; ++w) s += scratch[w];
    return s;
}

__device__ __forceinline__ float block_max(float v, float *scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = (blockDim.x + 31) / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < nwarps; ++w) m = fmaxf(m, scratch[w]);
    return m;
}

// Programmatic dependent launch (sm_90+). The forward's kernels are launched so that the next
// one may start while this one finishes; each kernel therefore follows one rule: before
// pdl_wait() it reads only what no kernel of the current step writes (weights; and, in the
// attention kernel, the position and the cache rows of earlier positions, written before the
// step began) and writes nothing; everything else that reads or writes activations, the KV
// cache, the token or the position comes after it.
// pdl_wait() returns once every earlier kernel has completed and its writes are visible (at
// once when the kernel was launched without the attribute). pdl_launch_dependents() lets the
// next kernel be scheduled; it grants nothing else.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem, ctx->stream>>>(args...) with the programmatic-serialization
// attribute on devices of compute capability 9.0 or more (a plain launch elsewhere), in clusters
// of `cluster` blocks when it is not 0, and checks the launch as ARC_LAUNCHED does.
template <typename... Params, typename... Args>
int arc_launch_ex(arc_context *ctx, const char *name, void (*kernel)(Params...), dim3 grid, dim3 block,
                  size_t smem, int cluster, Args... args) {
    cudaLaunchAttribute attrs[2];
    int n = 0;
    if (ctx->cc_major >= 9) {
        attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster) {
        attrs[n].id = cudaLaunchAttributeClusterDimension;
        attrs[n].val.clusterDim.x = cluster;
        attrs[n].val.clusterDim.y = 1;
        attrs[n++].val.clusterDim.z = 1;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ctx->stream;
    cfg.attrs = attrs;
    cfg.numAttrs = n;
    cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
    if (err != cudaSuccess) {
        ctx->counters.kernel_launches++;
        ctx->counters.cuda_calls++;
        cudaGetLastError();  // clear it: the status below reports it
        return arc_fail_cuda(err, name, "cudaLaunchKernelEx");
    }
    ARC_LAUNCHED(ctx, name);
    return ARC_OK;
}

template <typename... Params, typename... Args>
int arc_launch_pdl(arc_context *ctx, const char *name, void (*kernel)(Params...), dim3 grid, dim3 block,
                   size_t smem, Args... args) {
    return arc_launch_ex(ctx, name, kernel, grid, block, smem, 0, args...);
}

// Returns the status of a failed launcher: a forward stops at the first error.
#define ARC_TRY(call)                          \
    do {                                       \
        int arc_st_ = (call);                  \
        if (arc_st_ != ARC_OK) return arc_st_; \
    } while (0)

// silu(g) = g / (1 + exp(-g)); for very negative g, exp overflows to inf and g / inf = -0.
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }
// GELU, tanh form: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), in float32 (Gemma's GLU).
__device__ __forceinline__ float gelu_tanh(float g) {
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}
// The GLU of a gate and an up value under an arc_activation: act(g) * u.
__device__ __forceinline__ float glu(float g, float u, int act) {
    return (act == ARC_ACT_GELU_TANH ? gelu_tanh(g) : silu(g)) * u;
}

// The GEMV stages its input as float32 in shared memory: 192 KiB of it at most.
enum { GEMV_MAX_COLS = 49152 };
// Attention's limits (its chunk of positions per block depends on head_dim: attention.cu).
enum { ATTN_MAX_SEQ = 1 << 20, ATTN_MAX_HEAD_DIM = 256 };

// The launchers are the arc_op_* entry points of arc.h; shapes and limits are documented at
// each kernel. Bytes of scratch arc_op_attention needs for these shapes (0 if invalid).
uint64_t arc_attention_scratch_bytes(int32_t n_heads, int32_t head_dim, int32_t max_seq);

// Global loads that skip L1 (weights stream through once: L1 is better left to what is reused),
// from data no kernel of the step writes (.nc).
__device__ __forceinline__ uint32_t load_nc32(const void *p) {
    uint32_t r;
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ uint32_t load_nc16(const void *p) {
    unsigned short r;
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ uint2 load_nc64(const void *p) {
    uint2 r;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}
__device__ __forceinline__ uint4 load_nc128(const void *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// ---- Tensor cores (sm_80+), for the prefill's matrix products and attention ----------------

// 16 bytes global -> shared without a register round trip; with valid false the 16 bytes are
// zero-filled and nothing is read (src must still be a legal address).
__device__ __forceinline__ void cp_async16(uint32_t smem, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING)); }

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Four 8x8 bf16 matrices from shared memory, lane l giving the address of row l % 8 of matrix
// l / 8; `trans` hands each thread the transposed elements.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d (16x8 f32) += a (16x16 bf16, row-major fragment) . b (16x8 bf16, column-major fragment).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16 (nearest even, NaN kept) in one word, lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// x[dim] = float(table[tok, :]) * scale, table bf16 (vocab, dim), by the block's threads (nthreads);
// a token outside [0, vocab) fills x with NaN instead of reading out of bounds. dim % 8 == 0,
// table and x 16-byte aligned. The decode's embedding and the prefill's rows gather alike.
__device__ __forceinline__ void embed_row(const uint16_t *__restrict__ table, int vocab, int dim, uint32_t tok,
                                          float scale, float *__restrict__ x, int nthreads) {
    const int nvec = dim / 8;
    float4 *x4 = reinterpret_cast<float4 *>(x);
    if (tok >= (uint32_t)vocab) {
        const float nan = quiet_nan();
        for (int v = threadIdx.x; v < nvec; v += nthreads) {
            x4[2 * v] = make_float4(nan, nan, nan, nan);
            x4[2 * v + 1] = make_float4(nan, nan, nan, nan);
        }
        return;
    }
    const uint4 *row = reinterpret_cast<const uint4 *>(table + (size_t)tok * dim);
    for (int v = threadIdx.x; v < nvec; v += nthreads) {
        const uint4 g = row[v];
        x4[2 * v] = make_float4(bf16_lo(g.x) * scale, bf16_hi(g.x) * scale, bf16_lo(g.y) * scale, bf16_hi(g.y) * scale);
        x4[2 * v + 1] = make_float4(bf16_lo(g.z) * scale, bf16_hi(g.z) * scale, bf16_lo(g.w) * scale,
                                    bf16_hi(g.w) * scale);
    }
}

// acc + dot(8 bf16 weights, 8 floats a.xyzw b.xyzw); element 0 is the low half of w.x.
__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b, float acc) {
    acc = fmaf(bf16_lo(w.x), a.x, acc);
    acc = fmaf(bf16_hi(w.x), a.y, acc);
    acc = fmaf(bf16_lo(w.y), a.z, acc);
    acc = fmaf(bf16_hi(w.y), a.w, acc);
    acc = fmaf(bf16_lo(w.z), b.x, acc);
    acc = fmaf(bf16_hi(w.z), b.y, acc);
    acc = fmaf(bf16_lo(w.w), b.z, acc);
    acc = fmaf(bf16_hi(w.w), b.w, acc);
    return acc;
}

// ss plus the squares of 8 inputs a.xyzw b.xyzw, in the order every fused or row norm adds them.
__device__ __forceinline__ float add_sq8(float ss, float4 a, float4 b) {
    ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    ss += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
    return ss;
}

// A layer's RoPE as the attention kernels apply it: the layer's frequencies (half of them), the
// rotated elements 0..2 half - 1 of a head (the rest pass unrotated), and the factor cos and sin
// are multiplied by (arc.h: rope_dim, rope_factor).
struct RopeArgs { const float *inv_freq; int half; float factor; };

// What a layer's attention does besides attend: its RoPE, the scores' factor, and its window
// (0: every position; else a query at p attends p - window + 1..p).
struct AttnSpec {
    RopeArgs rope;
    double scale;  // rounded to float once, with log2(e) where a kernel works in base 2
    int window;
};

// The cosine and sine of pair i at position pos, the factor applied, as the reference computes
// them: angle float(pos) * inv_freq[i] rounded once, sincos in float32, each times the factor.
// PLAIN: the factor is 1 (the multiplies, which would change nothing, are left out).
template <bool PLAIN = false>
__device__ __forceinline__ void rope_angles(const RopeArgs &r, int pos, int i, float *s, float *c) {
    sincosf(__fmul_rn((float)pos, r.inv_freq[i]), s, c);
    if (!PLAIN) { *s = __fmul_rn(*s, r.factor); *c = __fmul_rn(*c, r.factor); }
}

// Element d of a head row x (float32) under rotate-half RoPE of `half` pairs: d < half pairs with
// d + half, d < 2 half with d - half (angle i = d mod half, cosine c[i], sine s[i]), and an element
// past the rotated ones is x[d]. Explicit roundings (no fused multiply-add), as the reference
// computes it; the decode, the prefill and the verify rotate identically.
// PLAIN: every element is rotated (2 half is the row's length).
template <bool PLAIN = false>
__device__ __forceinline__ float rope_rotate_half(const float *x, int d, int half, const float *c, const float *s) {
    if (d < half) return __fsub_rn(__fmul_rn(x[d], c[d]), __fmul_rn(x[d + half], s[d]));
    if (!PLAIN && d >= 2 * half) return x[d];
    const int i = d - half;
    return __fadd_rn(__fmul_rn(x[d], c[i]), __fmul_rn(x[i], s[i]));
}

// arc_op_embedding with the rows scaled (a config's embed_scale).
int embedding_scaled(arc_context *ctx, const uint16_t *table, int32_t vocab, int32_t dim, const uint32_t *token,
                     float scale, float *x);
// The rows of one attention launch: the decode's one, or the verify's count of rows at positions
// pos[0..count), qkv rows `stride` floats apart, outputs (count, n_heads, head_dim), count times
// the scratch and count * n_heads zeroed tickets `done` of their own.
struct AttnRows {
    int count = 1, stride = 0;
    unsigned *done = nullptr;
};
// arc_op_attention and arc_op_prefill_attention as a layer runs them (AttnSpec): the forward, the
// verify (rows) and the prefill launch these; the entry points rotate every element at factor 1,
// scale the scores by 1 / sqrt(head_dim) and attend every position.
int attention_layer(arc_context *ctx, const float *qkv, const AttnSpec &spec, uint16_t *k_cache, uint16_t *v_cache,
                   int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t max_seq, const int32_t *pos,
                   float *scratch, float *out, const AttnRows &rows = AttnRows{});
int prefill_attention_layer(arc_context *ctx, const float *qkv, const AttnSpec &spec, uint16_t *k_cache, uint16_t *v_cache,
                           int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t max_seq, int32_t n,
                           int32_t start, uint16_t *q_scratch, uint16_t *out, float *part, uint64_t part_n);
// Floats of partials the prefill's attention of n queries from start takes (0: none).
uint64_t prefill_attention_part_floats(int32_t n_heads, int32_t head_dim, int32_t n, int32_t start);
// Each q and k head of qkv (rows, stride) float32, in place: head * rsqrt(mean(head^2) + eps) *
// w, w = q_norm for the n_heads q heads, k_norm for the n_kv_heads k heads (norms.cu).
int launch_head_norm(arc_context *ctx, float *qkv, int32_t rows, int32_t stride, int32_t n_heads,
                     int32_t n_kv_heads, int32_t head_dim, const uint16_t *q_norm, const uint16_t *k_norm, float eps,
                     float norm_add);

// The prefill's tensor-core launchers (gemm.cu, prefill_attention.cu) are the arc_op_gemm_bf16,
// arc_op_gemm_swiglu_bf16 and arc_op_prefill_attention entry points of arc.h.

// The prefill's and the speculative step's buffers (buffers.cuh).
struct PrefillBuffers;
struct SpecBuffers;

// h (m, n) = bf16(act(a Wg^T) * (a Wu^T)), w_gate_up = [Wg; Wu] (2 n, k), act an arc_activation,
// as arc_op_gemm_swiglu_bf16; where the product fills an sm_90 GPU, it runs on gemm_sm90.cu in
// chunks of scratch_rows rows of a through scratch (scratch_rows, 2 n) float32, then the GLU.
int gemm_swiglu_rows(arc_context *ctx, const char *who, const uint16_t *a, const uint16_t *w_gate_up, int32_t m,
                     int32_t n, int32_t k, int act, uint16_t *h, float *scratch, int32_t scratch_rows);


// The verify forward's attention (verify_attention.cu): k and v of qkv (rows, stride) to the cache
// at each row's position, then out (rows, n_heads, hd) float32, each row the decode's attention at
// its position; scratch: rows times arc_attention_scratch_bytes, done: rows * n_heads zeroed tickets.
int launch_verify_attention(arc_context *ctx, const float *qkv, int rows, int stride, const int32_t *positions,
                            const AttnSpec &spec, uint16_t *k_cache, uint16_t *v_cache, int n_heads, int n_kv_heads,
                            int hd, int max_seq, float *scratch, unsigned *done, float *out);
// The bf16 GEMV over m <= 8 rows (gemv_rows.cu): y (m rows of `rows` values, ldy apart) = W @
// n(x[i]) (+ bias) (+ y when accumulate), or with gated act(gate) * up (accumulate carries the
// arc_activation); with a norm, n(x) goes through xn (m, cols). Each row's output has the bits of
// the one-row GEMV's.
int gemv_rows(arc_context *ctx, const char *who, const uint16_t *w, const float *x, int32_t m, int32_t rows,
              int32_t cols, const uint16_t *bias, const uint16_t *norm_weight, float eps, float norm_add,
              int32_t accumulate, bool gated, float *xn, float *y, int32_t ldy);

// The lm_head GEMV with the argmax of its rows (gemv.cu): committed to loop when it is not null,
// else written to *out and *value_out; `who` names the entry point in errors.
int launch_gemv_argmax(arc_context *ctx, const char *who, const uint16_t *w, const float *x, int32_t rows,
                       int32_t cols, const uint16_t *norm_weight, float eps, float norm_add, float *y, arc_loop *loop,
                       int32_t *out, float *value_out);
// arc_op_gemv with the norm's factors norm_add + w (gemv.cu); `who` names the caller.
int launch_gemv_rows(arc_context *ctx, const char *who, const uint16_t *w, const float *x, int32_t rows, int32_t cols,
                     const uint16_t *bias, const uint16_t *norm_weight, float eps, float norm_add, int32_t accumulate,
                     float *y);

// ---- What the prefill (prefill.cu) reads of a model (model.cu) ------------------------------

// A weight matrix as the forward reads it: its data and its arc_format (bf16 or quantized).
struct Weight {
    const void *p;
    int32_t format;
};

// One layer's weights and KV cache, each (n_kv_heads, max_seq, head_dim). Wq Wk Wv lie one after
// the other (so do bq bk bv, and Wgate Wup: one matrix, of one format), so that consecutive
// parts of one format are read as one matrix from the first.
struct LayerParts {
    const uint16_t *attn_norm, *bqkv, *mlp_norm;
    const uint16_t *q_norm, *k_norm;  // (head_dim) each, with qk_norm; else null
    const float *inv_freq;            // the layer's RoPE frequencies (rope_dim / 2)
    const uint16_t *post_attn_norm, *post_ffn_norm;  // (dim) each, with post_norms; else null
    int window;                       // the positions its attention reads (0: all)
    Weight wq, wk, wv, wo, w_gate_up, w_down;
    // A mixture of experts' layer: the router (bf16, the shared expert's gate row after it), the
    // experts' [gates; ups] and downs, the shared expert's [gate; up] and down.
    Weight router, e_gate_up, e_down, s_gate_up, s_down;
    uint16_t *k_cache, *v_cache;
};

struct ModelParts {
    arc_context *ctx;
    arc_model_config cfg;
    int32_t q_dim, kv_dim, qkv_rows;
    const uint16_t *embed, *final_norm;
    Weight lm_head;  // the embedding when tied
    float *x, *qkv, *att, *h, *scratch;  // the decode's activations (dim, q_dim + 2 kv_dim, q_dim, ffn_dim)
    float *t;                            // with post_norms: a product's output before its norm (dim)
    float *router;                       // MoE: the router's logits (n_experts + 1)
    int32_t *route_ids;                  // MoE: the chosen experts (n_experts_used), then their
    float *route_w;                      // weights and the shared expert's (n_experts_used + 1)
    float *logits;
    PrefillBuffers *prefill;
    SpecBuffers *spec;
    uint64_t dequant_elems;  // weights of the largest quantized matrix the prefill reads (0: none)
};

ModelParts model_parts(arc_model *m);
LayerParts model_layer(const arc_model *m, int layer);
// ARC_OK, or the error naming the first tensor the forward needs that was never uploaded, as
// reported by entry point `who`.
int model_check_uploaded(const arc_model *m, const char *who);

// What every norm of a model adds to its stored weights: 1 where they are stored less one
// (arc_model_config.norm_plus_one), else 0. The internal launchers below take it beside eps; the
// public arc_op_* entry points keep 0.
inline float norm_offset(const arc_model_config &c) { return c.norm_plus_one ? 1.0f : 0.0f; }

// The GEMVs over a Weight of any format (quant.cu): arc_op_gemv or arc_op_qgemv, and so on. With
// ffn_handoff true for the FFN's matrices, the SwiGLU GEMV (hand) gives the down GEMV (handed)
// its output already quantized (qinput.cuh), and the two run one after the other.
int gemv_weight(arc_context *ctx, Weight w, const float *x, int32_t rows, int32_t cols, const uint16_t *bias,
                const uint16_t *norm_weight, float eps, float norm_add, int32_t accumulate, float *y,
                bool handed = false);
int gemv_swiglu_weight(arc_context *ctx, Weight w, const float *x, int32_t rows, int32_t cols,
                       const uint16_t *norm_weight, float eps, float norm_add, int act, float *y, bool hand = false);
bool ffn_handoff(Weight gate_up, Weight down, int32_t ffn_dim);
// arc_op_gemv_swiglu under an arc_activation; `who` names the caller.
int gemv_glu(arc_context *ctx, const char *who, const uint16_t *w_gate_up, const float *x, int32_t rows, int32_t cols,
             const uint16_t *norm_weight, float eps, float norm_add, int act, float *y);
// x[r] += rmsnorm(t[r], w) for rows r of dim floats: a product's output normed before the residual
// add (ARC_OP_ATTN_OUT_NORM, ARC_OP_FFN_OUT_NORM; norms.cu).
int launch_add_norm_rows(arc_context *ctx, float *x, const float *t, int32_t rows, int32_t dim, const uint16_t *w,
                         float eps, float norm_add);
int gemv_argmax_weight(arc_context *ctx, const char *who, Weight w, const float *x, int32_t rows, int32_t cols,
                       const uint16_t *norm_weight, float eps, float norm_add, float *y, arc_loop *loop);
// y = [Wq; Wk; Wv] @ n(x) (+ [bq; bk; bv]): one GEMV for each run of parts of one format.
int gemv_qkv(arc_context *ctx, const LayerParts &lw, int32_t q_rows, int32_t kv_rows, const float *x, int32_t cols,
             float eps, float norm_add, float *y);
// The verify's products over m <= 8 rows of a Weight of any format: gemv_rows (bf16) or the
// quantized rows GEMV (qgemv_rows.cu), each row of y (ldy apart) the bits of the one-row GEMV of
// that format. scratch: m * cols floats, 16-byte aligned (the normed rows, or the quantized ones).
int gemv_rows_weight(arc_context *ctx, const char *who, Weight w, const float *x, int32_t m, int32_t rows,
                     int32_t cols, const uint16_t *bias, const uint16_t *norm_weight, float eps, float norm_add,
                     int32_t accumulate, bool gated, float *scratch, float *y, int32_t ldy);
