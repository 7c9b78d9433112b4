/* arc_model.h -- the model of libarc's C ABI (arc.h states its rules and includes this header): a
 * decoder's config, its tensor table and layer program, the weight formats, its forwards (the decode
 * step, the prefill, the prompt's log-probabilities) and its speculative steps.
 *
 * The declarations between the cdef markers join arc.h's in the cffi cdef of arcpy/_lib.py.
 */
#ifndef ARC_MODEL_H
#define ARC_MODEL_H

#include "arc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* arc-cdef-begin */
/* The model: a decoder of the Llama family and its kin (below: what a family changes) at batch 1. Weights are bf16
 * (raw 16-bit words) or quantized (arc_format, below), the RoPE inverse frequencies float32; the KV cache is bf16,
 * activations float32. The forward reads the token and the position from an arc_loop, so a graph captured once
 * replays unchanged at every position. */
typedef enum arc_tensor {
    ARC_TENSOR_EMBED = 0,           /* (vocab, dim) */
    ARC_TENSOR_ATTN_NORM = 1,       /* per layer (dim) */
    ARC_TENSOR_WQ = 2,              /* per layer (n_heads * head_dim, dim), absent on DeltaNet layers */
    ARC_TENSOR_WK = 3,              /* per layer (n_kv_heads * head_dim, dim), absent on DeltaNet and shared layers */
    ARC_TENSOR_WV = 4,              /* per layer (n_kv_heads * head_dim, dim), absent on DeltaNet and shared layers */
    ARC_TENSOR_BQ = 5,              /* per layer (n_heads * head_dim), only with qkv_bias, absent on DeltaNet layers */
    ARC_TENSOR_BK = 6,              /* per layer (n_kv_heads * head_dim), only with qkv_bias, absent on DeltaNet
                                       and shared layers */
    ARC_TENSOR_BV = 7,              /* per layer (n_kv_heads * head_dim), only with qkv_bias, absent on DeltaNet
                                       and shared layers */
    ARC_TENSOR_WO = 8,              /* per layer (dim, n_heads * head_dim), absent on DeltaNet layers */
    ARC_TENSOR_MLP_NORM = 9,        /* per layer (dim) */
    ARC_TENSOR_W_GATE = 10,         /* per layer (ffn_dim, dim), absent on MoE layers (but with experts_beside);
                                       2 ffn_dim on a shared layer with double_wide_ffn */
    ARC_TENSOR_W_UP = 11,           /* per layer (ffn_dim, dim), absent on MoE layers (but with experts_beside);
                                       2 ffn_dim on a shared layer with double_wide_ffn */
    ARC_TENSOR_W_DOWN = 12,         /* per layer (dim, ffn_dim), absent on MoE layers (but with experts_beside);
                                       2 ffn_dim on a shared layer with double_wide_ffn */
    ARC_TENSOR_FINAL_NORM = 13,     /* (dim) */
    ARC_TENSOR_LM_HEAD = 14,        /* (vocab, dim), absent when tied to the embedding */
    ARC_TENSOR_ROPE_INV_FREQ = 15,  /* per layer (rope_dim / 2) float32, absent on DeltaNet layers: the layer's RoPE */
    ARC_TENSOR_Q_NORM = 16,         /* per layer (head_dim), only with qk_norm, absent on DeltaNet layers */
    ARC_TENSOR_K_NORM = 17,         /* per layer (head_dim), only with qk_norm, absent on DeltaNet and shared layers */
    ARC_TENSOR_POST_ATTN_NORM = 18, /* per layer (dim), only with post_norms */
    ARC_TENSOR_POST_FFN_NORM = 19,  /* per layer (dim), only with post_norms */
    ARC_TENSOR_MOE_ROUTER = 20,     /* per layer (n_experts, dim), only on MoE layers */
    ARC_TENSOR_MOE_GATE = 21,       /* per layer (n_experts * expert_ffn_dim, dim), only on MoE layers */
    ARC_TENSOR_MOE_UP = 22,         /* per layer (n_experts * expert_ffn_dim, dim), only on MoE layers */
    ARC_TENSOR_MOE_DOWN = 23,       /* per layer (n_experts * dim, expert_ffn_dim), only on MoE layers */
    ARC_TENSOR_SHARED_GATE = 24,    /* per layer (shared_ffn_dim, dim), only on MoE layers with a shared expert */
    ARC_TENSOR_SHARED_UP = 25,      /* per layer (shared_ffn_dim, dim), only on MoE layers with a shared expert */
    ARC_TENSOR_SHARED_DOWN = 26,    /* per layer (dim, shared_ffn_dim), only on MoE layers with a shared expert */
    ARC_TENSOR_SHARED_ROUTER = 27,  /* per layer (1, dim), only on MoE layers with a shared expert */
    ARC_TENSOR_WQ_GATE = 28,        /* per layer (n_heads * head_dim, dim), only with attn_gate, absent on DeltaNet
                                       layers */
    /* A gated DeltaNet layer's (arc_model_config: dn_layers), where its attention's are absent; K = dn_k_heads *
     * dn_head_dim, V = dn_v_heads * dn_head_dim, conv = 2 K + V channels. Rows are heads' in order. */
    ARC_TENSOR_DN_QKV = 29,         /* per layer (conv, dim), only on DeltaNet layers: the convolution's q, k, v */
    ARC_TENSOR_DN_Z = 30,           /* per layer (V, dim), only on DeltaNet layers: the output gate */
    ARC_TENSOR_DN_B = 31,           /* per layer (dn_v_heads, dim), only on DeltaNet layers: beta's input */
    ARC_TENSOR_DN_A = 32,           /* per layer (dn_v_heads, dim), only on DeltaNet layers: the decay's input */
    ARC_TENSOR_DN_CONV = 33,        /* per layer (conv, dn_conv_kernel), only on DeltaNet layers: newest input last */
    ARC_TENSOR_DN_A_LOG = 34,       /* per layer (dn_v_heads), only on DeltaNet layers: the decay's log rate */
    ARC_TENSOR_DN_DT_BIAS = 35,     /* per layer (dn_v_heads), only on DeltaNet layers */
    ARC_TENSOR_DN_NORM = 36,        /* per layer (dn_head_dim), only on DeltaNet layers: never 1 + w */
    ARC_TENSOR_DN_OUT = 37,         /* per layer (dim, V), only on DeltaNet layers */
    /* gpt-oss's (arc_model_config: attn_sinks, o_bias, expert_bias). */
    ARC_TENSOR_SINKS = 38,          /* per layer (n_heads), only with attn_sinks, absent on DeltaNet layers: each query
                                       head's sink logit */
    ARC_TENSOR_BO = 39,             /* per layer (dim), only with o_bias, absent on DeltaNet layers */
    ARC_TENSOR_MOE_ROUTER_BIAS = 40, /* per layer (n_experts), only on MoE layers, only with expert_bias */
    ARC_TENSOR_MOE_GATE_BIAS = 41,  /* per layer (n_experts * expert_ffn_dim), only on MoE layers, only with expert_bias */
    ARC_TENSOR_MOE_UP_BIAS = 42,    /* per layer (n_experts * expert_ffn_dim), only on MoE layers, only with expert_bias */
    ARC_TENSOR_MOE_DOWN_BIAS = 43,  /* per layer (n_experts * dim), only on MoE layers, only with expert_bias */
    /* Gemma 4's (arc_model_config: layer_scalar). */
    ARC_TENSOR_LAYER_SCALAR = 44,   /* per layer (1), only with layer_scalar: the layer's output factor */
    /* Gemma 4's experts beside the dense FFN (arc_model_config: experts_beside), on its MoE layers. */
    ARC_TENSOR_MOE_NORM = 45,       /* per layer (dim), only with experts_beside: the experts' input norm */
    ARC_TENSOR_FFN_OUT_NORM = 46,   /* per layer (dim), only with experts_beside: the dense FFN's output norm */
    ARC_TENSOR_MOE_OUT_NORM = 47,   /* per layer (dim), only with experts_beside: the experts' output norm */
    ARC_TENSOR_ROUTER_SCALE = 48,   /* per layer (dim), only with experts_beside: the router's input factors */
    ARC_TENSOR_EXPERT_SCALE = 49,   /* per layer (n_experts), only with experts_beside: each expert's weight's factor */
    /* Gemma 4's per-layer embeddings (arc_model_config: ple_dim). */
    ARC_TENSOR_PLE_EMBED = 50,      /* (ple_vocab, n_layers * ple_dim), only with ple_dim: each token's rows */
    ARC_TENSOR_PLE_PROJECTION = 51, /* (n_layers * ple_dim, dim), only with ple_dim */
    ARC_TENSOR_PLE_NORM = 52,       /* (ple_dim), only with ple_dim */
    ARC_TENSOR_PLE_GATE = 53,       /* per layer (ple_dim, dim), only with ple_dim */
    ARC_TENSOR_PLE_OUT = 54,        /* per layer (dim, ple_dim), only with ple_dim */
    ARC_TENSOR_PLE_POST_NORM = 55,  /* per layer (dim), only with ple_dim */
    ARC_TENSOR_COUNT = 56
} arc_tensor;
/* The GLU act(g) * u: SILU g * sigmoid(g); GELU_TANH 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))); SWIGLU_LIMIT
 * (gpt-oss's) g' * sigmoid(1.702 g') * (u' + 1) with g' = min(g, 7) and u' = u clamped to [-7, 7]. */
typedef enum arc_activation { ARC_ACT_SILU = 0, ARC_ACT_GELU_TANH = 1, ARC_ACT_SWIGLU_LIMIT = 2 } arc_activation;
typedef enum arc_routing { ARC_ROUTE_SOFTMAX_TOPK = 0, ARC_ROUTE_TOPK_SOFTMAX = 1 } arc_routing;

/* What a family changes in the layer is data (below; 0 keeps Llama's behaviour). RoPE: element i
 * of a head pairs with i + rope_dim / 2 at angle float(pos) * inv_freq[i] of the layer's own table
 * (zeros: a layer without RoPE). Layer l is windowed when sliding_window > 0, unless window_pattern
 * n > 0 and l % n == n - 1: its query at p then attends p - sliding_window + 1..p only. */
typedef struct arc_model_config {
    int32_t dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, max_seq;
    float rms_eps;
    int32_t tied_embeddings, qkv_bias;  /* 0 or 1 each: the lm_head is the embedding; q/k/v biases */
    int32_t qk_norm;         /* q, k heads RMS-normed by Q_NORM / K_NORM before RoPE (Qwen3, Gemma 3) */
    int32_t rope_dim;        /* RoPE rotates a head's first rope_dim elements (even; 0: head_dim) */
    float rope_factor;       /* cos and sin times it (YaRN's, LongRoPE's attention factor; 0: 1) */
    int32_t post_norms;      /* attention and FFN outputs RMS-normed before the residual add (Gemma 3) */
    int32_t activation;      /* the GLU's, an arc_activation */
    float embed_scale, attn_scale;  /* the embedding row's factor (0: 1), the scores' (0: 1 / sqrt(head_dim)) */
    int32_t sliding_window, window_pattern;  /* a windowed layer's positions (0: none); every n-th layer global */
    int32_t norm_plus_one;   /* 0 or 1: every norm's factor is 1 + w, its weights stored less one (Gemma) */
    /* Mixture of experts (n_experts 0: none): layer l is one unless (l + 1) % moe_every != 0 (0: 1) or bit l % 32 of
     * dense_layers[l / 32] is set. Routing of p = ROUTER @ n, top k = n_experts_used ties to the lower expert:
     * SOFTMAX_TOPK the top k of softmax(p), divided by their sum if norm_topk; TOPK_SOFTMAX the top k of p, weights
     * their softmax. Expert e (rows e * expert_ffn_dim.. of MOE_GATE, MOE_UP, e * dim.. of MOE_DOWN) adds weight times
     * Wdown_e @ act(Wgate_e @ n) * (Wup_e @ n); shared_ffn_dim > 0: + sigmoid(SHARED_ROUTER @ n) * shared expert.
     * arc_model_create takes n_experts <= 1024, n_experts_used <= 16, expert_ffn_dim % 8 == 0 and n_experts_used *
     * expert_ffn_dim <= 49152; the routing stays on the device, so a captured step serves every routing. */
    int32_t n_experts, n_experts_used, expert_ffn_dim, routing, norm_topk, shared_ffn_dim, moe_every;
    uint32_t dense_layers[4];
    /* attn_gate 1: the attention's output is multiplied by sigmoid(WQ_GATE @ n) before Wo (ARC_OP_ATTN_GATE). */
    int32_t attn_gate;
    /* Gated DeltaNet layers (Qwen3.5): layer l is one where bit l % 32 of dn_layers[l / 32] is set; it keeps no KV
     * rows but a state of fixed size: its convolution's last dn_conv_kernel - 1 inputs and, per value head, a
     * (dn_head_dim, dn_head_dim) float32 matrix S. Value head h reads key head h / (dn_v_heads / dn_k_heads). For a
     * token, with n = rmsnorm(x, ATTN_NORM): u = causal depthwise convolution of DN_QKV @ n over the last
     * dn_conv_kernel inputs, then SiLU; q and k heads of u L2-normalized (x / sqrt(sum x^2 + 1e-6)), q times
     * 1 / sqrt(dn_head_dim); beta = sigmoid(DN_B @ n), g = -exp(A_LOG) * softplus(DN_A @ n + DT_BIAS) per value head;
     * S <- exp(g) S, S <- S + k (beta (v - S^T k))^T, o = S^T q; att = rmsnorm(o, DN_NORM) * silu(DN_Z @ n) per head;
     * x += DN_OUT @ att. Position 0 starts from a zero state. arc_model_create takes dn_head_dim 128 alone. */
    int32_t dn_k_heads, dn_v_heads, dn_head_dim, dn_conv_kernel;
    uint32_t dn_layers[4];
    /* gpt-oss's, 0 or 1 each. attn_sinks: each query head's SINKS logit s joins its softmax's denominator alone
     * (p_j = exp(x_j) / (sum_i exp(x_i) + exp(s)), x the scaled scores). o_bias: x += Wo @ att + BO. expert_bias: the
     * router's logits + MOE_ROUTER_BIAS, expert e's gate and up products + its rows of MOE_GATE_BIAS, MOE_UP_BIAS
     * before the GLU, its down product + its rows of MOE_DOWN_BIAS before its weight. */
    int32_t attn_sinks, o_bias, expert_bias;
    /* The form the KV cache holds its rows in, an arc_kv_form (0: bf16). Q8_0 takes head_dim % 32 == 0 and
     * head_dim <= 256. */
    int32_t kv_cache;
    /* Gemma 4's (0 each: none). A layer that attends every position (not windowed) has heads of global_head_dim
     * elements (0: head_dim) and global_n_kv_heads kv heads (0: n_kv_heads): its WQ, WK,
     * WV, WO, Q_NORM, K_NORM, RoPE table (global_head_dim / 2 with rope_dim 0) and cache rows take those sizes; heads
     * past 256 elements need a bf16 cache and no sinks. v_norm (0 or 1, with qk_norm): each v head RMS-normed without
     * weights (in QK_NORM). layer_scalar (0 or 1): x *= LAYER_SCALAR after the layer (ARC_OP_LAYER_SCALAR).
     * final_softcap > 0: every logit the lm_head writes is cap * tanh(logit / cap), before any argmax, draw or
     * log-probability. */
    int32_t global_head_dim, global_n_kv_heads, v_norm, layer_scalar;
    float final_softcap;
    /* Gemma 4's mixture of experts (0 or 1; with n_experts and post_norms, no shared expert and no expert_bias): a
     * MoE layer keeps its dense FFN (W_GATE, W_UP, W_DOWN of ffn_dim, input norm MLP_NORM) and runs the experts beside
     * it (ARC_OP_EXPERTS_BESIDE). The router reads r = rmsnorm(x) * ROUTER_SCALE (no other weights) and its logits
     * ROUTER @ r are scaled by 1 / sqrt(dim); the routing must be SOFTMAX_TOPK with norm_topk, and expert e's weight
     * is then times EXPERT_SCALE[e]. The experts read rmsnorm(x, MOE_NORM). The layer adds rmsnorm(rmsnorm(dense,
     * FFN_OUT_NORM) + rmsnorm(experts, MOE_OUT_NORM), POST_FFN_NORM), dense = Wdown @ h and experts their weighted
     * sum. */
    int32_t experts_beside;
    /* Gemma 4's per-layer embeddings (ple_dim 0: none; ple_vocab rows): before the layers, a token's PLE_EMBED row
     * times sqrt(ple_dim), plus rmsnorm(PLE_PROJECTION @ x * dim^-1/2, PLE_NORM) of the scaled embedding x, each
     * layer's ple_dim slice normed alone, the sum times 2^-1/2: layer l's slice p_l. ARC_OP_PER_LAYER_INPUT: x +=
     * rmsnorm(PLE_OUT @ (gelu_tanh(PLE_GATE @ x) * p_l), PLE_POST_NORM). kv_shared_layers: the last ones of the
     * layers compute no k or v ("shared layers": no WK, WV, BK, BV, K_NORM, no cache rows of their own); each
     * attends the cache of the last layer before them of its kind (windowed or not), which must exist.
     * double_wide_ffn (0 or 1, with kv_shared_layers): a shared layer's W_GATE, W_UP and W_DOWN take 2 ffn_dim.
     * arc_model_create takes ple_dim % 8 == 0 and shared layers without attn_gate. */
    int32_t ple_dim, ple_vocab, kv_shared_layers, double_wide_ffn;
} arc_model_config;
/* A KV row's form. BF16: hd bf16 elements, each rounded to nearest even. Q8_0: hd int8 codes and hd / 32 float16
 * scales, a block of 32 elements each: d = amax / 127 (float32), code = round(x * (1 / d)) (halves away from zero;
 * 0 where d is 0), d stored as float16; an element reads back as code times the stored d (34 bytes per 32 elements,
 * bf16's 64). The kernels attend over what the form reads back. */
typedef enum arc_kv_form { ARC_KV_BF16 = 0, ARC_KV_Q8_0 = 1 } arc_kv_form;
int arc_model_create(arc_context *ctx, const arc_model_config *config, arc_model **out);
/* The tensor table, the one libarc lays the weights out by and arcpy names and checks them by: tensor's (rows, cols)
 * in layer (0 for a global tensor) of a model of config, rows 0 where the config has none (a vector: rows 1).
 * Matrices are (out, in); ROPE_INV_FREQ is float32, the rest bf16 or a matrix's format. Host only, no context. */
int arc_tensor_shape(const arc_model_config *config, int32_t tensor, int32_t layer, int64_t *rows, int64_t *cols);

/* The layer program: the sequence of one decoder layer, written once and run by the decode step (GEMVs), the
 * speculative verify (GEMVs over rows), the prefill (tensor-core products) and arcpy's NumPy reference, each op in
 * its own form. arc_layer_program lists a layer's ops in order into ops (ARC_MAX_LAYER_OPS entries); host only, no
 * context. x is the residual stream (float32). */
typedef enum arc_layer_op {
    ARC_OP_ATTN_IN = 0,   /* qkv = [Wq; Wk; Wv] @ rmsnorm(x, ATTN_NORM) (+ [bq; bk; bv]) */
    ARC_OP_QK_NORM = 1,   /* each head of q and k = rmsnorm(head, Q_NORM / K_NORM); v's without weights (v_norm) */
    ARC_OP_ATTEND = 2,    /* q, k rotated (the layer's table); k, v -> the cache; att = attention */
    ARC_OP_ATTN_OUT = 3,  /* x += Wo @ att */
    ARC_OP_FFN_IN = 4,    /* h = act(Wgate @ n) * (Wup @ n), n = rmsnorm(x, MLP_NORM) */
    ARC_OP_FFN_OUT = 5,   /* x += Wdown @ h */
    ARC_OP_ATTN_OUT_NORM = 6,  /* x += rmsnorm(Wo @ att, POST_ATTN_NORM) */
    ARC_OP_FFN_OUT_NORM = 7,   /* x += rmsnorm(Wdown @ h, POST_FFN_NORM) */
    ARC_OP_MOE_IN = 8, ARC_OP_MOE_OUT = 9,  /* FFN_IN, FFN_OUT of a mixture of experts (arc_model_config) */
    ARC_OP_ATTN_GATE = 10,  /* att *= sigmoid(WQ_GATE @ rmsnorm(x, ATTN_NORM)), the gate made by ATTN_IN beside qkv */
    ARC_OP_DN_IN = 11,      /* u = [DN_QKV; DN_Z; DN_B; DN_A] @ rmsnorm(x, ATTN_NORM) */
    ARC_OP_DN_STEP = 12,    /* the DeltaNet's convolution and state update at the token's position -> att */
    ARC_OP_DN_OUT = 13,     /* x += DN_OUT @ att */
    ARC_OP_LAYER_SCALAR = 14,  /* x *= LAYER_SCALAR (the layer's last op) */
    ARC_OP_EXPERTS_BESIDE = 15,  /* after FFN_IN (h): x += the dense FFN's and the experts' outputs (experts_beside) */
    ARC_OP_PER_LAYER_INPUT = 16  /* x += the layer's per-layer input (ple_dim), before LAYER_SCALAR */
} arc_layer_op;
int arc_layer_program(const arc_model_config *config, int32_t layer, int32_t *ops, int32_t *count);

/* Weight formats. A matrix tensor (WQ, WK, WV, WO, W_GATE, W_UP, W_DOWN, LM_HEAD; MOE_, SHARED_ GATE, UP, DOWN;
 * WQ_GATE; DN_QKV, DN_Z, DN_B, DN_A, DN_OUT) may be held in one of the quantized formats below instead of bf16;
 * the embedding, the norms, the biases, the DeltaNet's vectors and the RoPE frequencies are always bf16 (float32
 * for the frequencies). The quantized formats are
 * llama.cpp's GGUF block types, repacked by row so that every load is 16-byte aligned and
 * coalesced; the values they hold are exactly the GGUF blocks' values.
 *
 * A row of `cols` weights (cols % 32 == 0; % 256 for the _K formats and IQ4_XS) is a sequence of
 * units of 32 consecutive weights (unit u: columns 32u..32u+31); a _K superblock is 8 units. A row is
 * four arrays, A then B then C then D, each padded with zeros to a multiple of 16 bytes; rows
 * follow each other with no gap (arc_format_row_bytes gives a row's size).
 *   A (quants): Q8_0: 32 bytes a unit, int8 weight k at byte k. Q4_0, Q4_1, Q4_K, Q5_K, Q6_K,
 *     Q5_0, Q5_1: 16 bytes a unit, byte k (0..15) holding the low 4 bits of weight k in its low
 *     nibble and those of weight k + 16 in its high nibble. MXFP4, IQ4_NL, IQ4_XS (codebook
 *     formats): 16 bytes a unit of 4-bit codes, its uint32 word i (0..3) holding those of weights
 *     4i..4i+3 in its nibbles 0..3 (from the least significant) and of weights 16+4i..16+4i+3 in
 *     its nibbles 4..7. Q3_K, Q2_K: 8 bytes a unit, two uint32 L0, L1, bits 8b + 2i and 8b + 2i + 1
 *     of L0 = the 2-bit quant of weight 4i + b, of L1 = that of weight 16 + 4i + b.
 *   B (high bits): Q5_K, Q5_0, Q5_1, Q3_K: a uint32 H a unit, bit 8b + i = bit 4 (Q3_K: bit 2)
 *     of weight 4i + b and bit 8b + 4 + i = that bit of weight 16 + 4i + b (b, i in 0..3). Q6_K:
 *     two uint32 H0, H1 a unit, bits 8b + 2i and 8b + 2i + 1 of H0 = bits 4 and 5 of weight
 *     4i + b, of H1 = those of weight 16 + 4i + b. Other formats: empty.
 *   C (scales): Q8_0, Q4_0: a float16 d a unit. Q4_1: float16 d then float16 m, a unit.
 *     Q4_K, Q5_K: 16 bytes a superblock, GGUF's own: float16 d, float16 dmin, 12 bytes of
 *     6-bit scales and mins (unit j of the superblock: GGUF's get_scale_min_k4(j)). Q6_K: 16
 *     int8 scales a superblock, scale j for its weights 16j..16j+15. MXFP4: a uint8 exponent e a
 *     unit. IQ4_NL: a float16 d a unit. IQ4_XS: an int8 scale s a unit (-32..31). Q5_0: a
 *     float16 d a unit. Q5_1: float16 d then float16 m, a unit. Q3_K: 16 int8 scales a superblock
 *     (-32..31), scale j for its weights 16j..16j+15. Q2_K: GGUF's 16 bytes a superblock, byte j
 *     for its weights 16j..16j+15: the scale in its low nibble, the min in its high one.
 *   D: Q6_K, IQ4_XS, Q3_K: a float16 d a superblock. Q2_K: float16 d then float16 dmin, a
 *     superblock. Other formats: empty.
 * The weight, with q the unit's quant (4 bits; 5 with the Q5 formats' high bit; 6 with Q6_K's two;
 * 2 with Q2_K's, 3 with Q3_K's and its high bit):
 *   Q8_0 d * q (q signed)     Q4_0 d * (q - 8)       Q4_1 d * q + m
 *   Q4_K, Q5_K  d * sc * q - dmin * m (sc, m: the unit's 6-bit scale and min)
 *   Q6_K  d * scale * (q - 32)    Q5_0 d * (q - 16)    Q5_1 d * q + m
 *   Q3_K  d * scale * (q - 4)     Q2_K  d * sc * q - dmin * m (sc, m: the nibbles of the weight's byte)
 *   MXFP4  2^(e - 128) * {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}[q] (e2m1, doubled)
 *   IQ4_NL d * V[q], IQ4_XS d * s * V[q]: V = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13,
 *     25, 38, 53, 69, 89, 113}
 * The quantized GEMVs quantize their input too, per unit: amax = max |x| over the unit's 32
 * inputs (after the fused norm), x_q = rint(x * (127 / amax)) clamped to [-127, 127] (0 where
 * amax is 0; +-127 where 127 / amax overflows), dx = amax / 127; the unit's dot is dx times an
 * exact integer sum of q * x_q, scaled as above. */
typedef enum arc_format { ARC_FORMAT_BF16 = 0, ARC_FORMAT_Q8_0 = 1, ARC_FORMAT_Q4_0 = 2, ARC_FORMAT_Q4_1 = 3,
                          ARC_FORMAT_Q4_K = 4, ARC_FORMAT_Q5_K = 5, ARC_FORMAT_Q6_K = 6, ARC_FORMAT_MXFP4 = 7,
                          ARC_FORMAT_IQ4_NL = 8, ARC_FORMAT_IQ4_XS = 9, ARC_FORMAT_Q5_0 = 10,
                          ARC_FORMAT_Q5_1 = 11, ARC_FORMAT_Q3_K = 12, ARC_FORMAT_Q2_K = 13 } arc_format;

/* Bytes of one row of `cols` weights in `format` (bf16: 2 * cols). Host only; no context. */
int arc_format_row_bytes(int32_t format, int32_t cols, uint64_t *out);

/* arc_model_create with a format for each tensor: formats[tensor * n_layers + layer] (global tensors at layer 0),
 * ARC_TENSOR_COUNT entries per layer; NULL means bf16 throughout. A tensor's upload then takes rows *
 * arc_format_row_bytes(format, cols) bytes. */
int arc_model_create_formats(arc_context *ctx, const arc_model_config *config, const int32_t *formats,
                             arc_model **out);
int arc_model_destroy(arc_model *model);
int arc_model_upload(arc_model *model, int32_t tensor, int32_t layer, const void *host, uint64_t bytes);
int arc_model_forward(arc_model *model, arc_loop *loop);
/* The greedy step in one kernel less: the forward, with its lm_head also taking the argmax of the logits and
 * committing it to loop as arc_loop_enqueue_sample_commit does (the same token, the same faults; the logits are
 * written as well). Captured, it is the greedy step graph. */
int arc_model_forward_commit(arc_model *model, arc_loop *loop);
int arc_model_logits(arc_model *model, const float **logits, int32_t *vocab);
/* Device bytes the model holds: its weights, its KV cache, and its activations (the decode's and, once reserved,
 * the prefill's, with its scratch for dequantized matrices and a mixture of experts' routed rows). */
int arc_model_memory(arc_model *model, uint64_t *weights, uint64_t *kv_cache, uint64_t *activations);

/* The prefill: a chunk of prompt tokens through the whole model in one forward. The matrix products run on tensor
 * cores with bf16 inputs and float32 sums: a product's input (the normed activations, the attention output, the
 * SwiGLU output) is rounded to bf16, the residual stream stays float32, and the KV cache is written exactly as the
 * decode writes it for each position (up to those roundings upstream). */

/* Reserves the prefill's activations for chunks of up to max_chunk tokens (allocates; call at load time, not per
 * request; a chunk is never longer than the model's max_seq, so at most that many are reserved). A later call with
 * a larger max_chunk reallocates; a smaller one keeps the reservation. Not while a graph is being captured. */
int arc_model_prefill_reserve(arc_model *model, int32_t max_chunk);
/* The forward over tokens[0..n) at positions start..start+n-1: the KV cache written for every one of them, and the
 * logits of the last (position start+n-1) written where arc_model_logits points, what arc_model_forward would leave
 * there for that token. In chunks of at most the reserved size, enqueued on the context's stream; no host wait, no
 * synchronize. `tokens` is device memory or a mapped host pointer (read on the device). Requires n >= 1, start >=
 * 0, start + n <= max_seq, a reservation, every tensor uploaded. Token ids are not checked on the device (an id
 * outside the vocabulary writes NaN, as the decode embedding does); the caller validates them. */
int arc_model_prefill(arc_model *model, const int32_t *tokens, int32_t n, int32_t start);
/* The prompt's own log-probabilities: arc_model_prefill(model, tokens, n, start) (the same KV rows, the same last
 * logits), and for each row r in [0, n - 1) the log-probability of tokens[r + 1] under log_softmax of that row's
 * logits[0..vocab), with the top_n most likely ids and theirs, as arc_loop_enqueue_logprobs computes and ranks them:
 * logprob[n - 1], top_ids and top_values [n - 1][ARC_MAX_TOP_LOGPROBS] (entries past top_n not written), device or
 * mapped memory, stream-ordered. A row's logits are those arc_model_prefill leaves for its last position (the
 * decode's lm_head GEMV): bit for bit what a prefill of tokens[0..r] leaves, whatever chunk the row is in. Requires
 * what arc_model_prefill requires, n >= 2, 1 <= vocab <= the lm_head's rows, 0 <= top_n <= ARC_MAX_TOP_LOGPROBS; a
 * target outside [0, vocab) scores NaN. */
int arc_model_prompt_logprobs(arc_model *model, const int32_t *tokens, int32_t n, int32_t start, int32_t vocab,
                              int32_t top_n, float *logprob, int32_t *top_ids, float *top_values);
/* The model's KV cache (device memory) in a bf16 form: k and v, each (attention layers, n_kv_heads, max_seq, head_dim)
 * bf16, the layers that attend in layer order (a DeltaNet layer keeps no rows); rows the forward or the prefill have
 * not written hold zeros. Another form: ARC_INVALID_ARGUMENT (arc_model_kv_planes describes every form). */
int arc_model_kv_cache(arc_model *model, uint16_t **k_cache, uint16_t **v_cache);
/* The KV cache in any form, as *count (<= ARC_KV_MAX_PLANES) planes: plane i at base[i] holds, for each attention
 * layer (layer order) and kv head, head_rows[i] rows of row_bytes[i] bytes, position p at row p. BF16: k's values,
 * v's (head_rows max_seq, row_bytes 2 head_dim). Q8_0: k's codes, v's (max_seq, head_dim), k's scales, v's (max_seq
 * rounded up to a multiple of 64, 2 head_dim / 32). Unwritten rows hold zeros. */
enum { ARC_KV_MAX_PLANES = 4 };
int arc_model_kv_planes(arc_model *model, int32_t *count, void **base, uint64_t *row_bytes, uint64_t *head_rows);
/* The DeltaNet layers' states (device memory): (layers, slots, slot_floats) float32, the DeltaNet layers in layer
 * order, each slot the convolution's last dn_conv_kernel - 1 inputs ((dn_k_heads * 2 + dn_v_heads) * dn_head_dim
 * channels, each channel's inputs oldest first) then every value head's S (dn_head_dim * dn_head_dim floats).
 * The state after positions 0..p-1 lies in slot p % slots: the step or prefill row at position p > 0 reads it, so a
 * prefill resumed at p after the slot is copied back computes what it computed the first time. *layers 0 (state
 * null, slots and slot_floats 0): the model keeps no state. */
int arc_model_state(arc_model *model, float **state, int32_t *layers, int32_t *slots, uint64_t *slot_floats);

/* ---- Speculative steps: up to k + 1 tokens a read of the weights (greedy or sampled; bf16 or quantized weights, no
 * mixture of experts). The draft: the latest earlier occurrence of the last n tokens (n = ngram down to 1, longest
 * first) in the loop's history (then in its memory of earlier sequences, ARC_SEQ_DRAFT_MEMORY), and the k
 * tokens that followed it (periodic past p). The verify forward: the token
 * and the drafts at positions p..p+k in one pass, each row through the decode's own kernels or their form over
 * rows, which keep each row's sums in the decode's order: every row's logits are the decode step's at that
 * position, bit for bit, so the tokens are the plain loop's, greedy or sampled with the same seed
 * (arc_op_gemv_rows and arc_op_qgemv_rows say how). The accept: the token after row 0 (its argmax, or sampled its
 * draw), then after row i while draft i matched the token after row i - 1, each through the commit's checks (and
 * the burst's limit); then .steps. The history (max_seq ids) gets every commit's token; ARC_SEQ_HISTORY writes
 * history[0..n_history) at history_start.., stream-ordered. ---- */
/* The drafts' memory of earlier sequences (ARC_SEQ_DRAFT_MEMORY): memory[0..n_memory), stream-ordered, kept until the
 * next (n_memory = 0 empties it). A negative id separates two sequences, and one follows the last. The draft looks it
 * up as if it came right before the history's position 0: a match there ranks below an equally long one in the
 * history, and its drafts stop at the next separator. It changes which tokens are drafted, never which are
 * published. */
enum { ARC_DRAFT_MEMORY = 16384 };  /* ARC_SEQ_DRAFT_MEMORY takes n_memory < this */
/* The step's buffers for k drafts (1..7; 0 frees them). At load, not while capturing; a mixture of experts is
 * refused. */
int arc_model_speculate_reserve(arc_model *model, int32_t k);
/* One speculative step on the loop, drafts by n-grams of up to ngram (1..8) tokens; capturable. */
int arc_model_forward_speculate(arc_model *model, arc_loop *loop, int32_t ngram);
/* The same step sampled: the token after each row is drawn from that row's logits with the loop's sampling
 * parameters at that row's position (ARC_SEQ_SAMPLING; the draw of arc_loop_enqueue_draw_commit, with the
 * same Philox counter: the position of the token drawn), and a draft is accepted where it equals the drawn token.
 * So every published token is a draw from the model's distribution after the tokens before it, and with the plain
 * step's logits it would be the plain sampled step's token. The loop's vocabulary must fit the draw
 * (arc_sample_max_vocab); capturable. */
int arc_model_forward_speculate_draw(arc_model *model, arc_loop *loop, int32_t ngram);
/* The last step's rows: logits (k + 1, vocab) float32, inputs tokens[0..k], tokens[k + 1] drafts. */
int arc_model_speculation(arc_model *model, const float **logits, const int32_t **tokens, int32_t *rows);

/* arc-cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* ARC_MODEL_H */
