/* arc_ops.h -- libarc's kernels, one entry point each: the decode's, the prefill's and the speculative
 * verify's launchers, callable alone on device buffers. The forward, the prefill and the speculative step launch
 * the same launchers; the GPU tests compare each with arcpy's NumPy reference through these. A program that
 * decodes a model needs only arc.h.
 *
 * The declarations between the cdef markers join arc.h's in the cffi cdef of arcpy/_lib.py.
 */
#ifndef ARC_OPS_H
#define ARC_OPS_H

#include "arc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* arc-cdef-begin */
/* Kernels, one entry point each (the forward launches the same launchers). */
/* Each enqueues on the context's stream and returns at once; pointers are device pointers (token may be a mapped
 * host pointer). bf16 arguments are raw 16-bit words. Token and position are read on the device, as in the forward. */

/* x[dim] = float(table[*token, :]); table (vocab, dim). dim % 8 == 0, table and x 16-byte aligned. A token outside
 * [0, vocab) writes NaN into x. */
int arc_op_embedding(arc_context *ctx, const uint16_t *table, int32_t vocab, int32_t dim,
                     const uint32_t *token, float *x);

/* y[rows] = W[rows, cols] @ n(x) (+ bias[rows]) (+ y if accumulate != 0), where n(x) = x, or x * rsqrt(mean(x^2) +
 * eps) * norm_weight[cols] when norm_weight is not NULL. bias and norm_weight are optional (NULL). cols % 8 == 0,
 * cols <= 49152, W, x and norm_weight 16-byte aligned, y distinct from x. */
int arc_op_gemv(arc_context *ctx, const uint16_t *w, const float *x, int32_t rows, int32_t cols,
                const uint16_t *bias, const uint16_t *norm_weight, float eps, int32_t accumulate,
                float *y);
/* arc_op_gemv without bias or accumulation, and the argmax of y (arc_argmax's rule: NaN first, then the largest
 * value, ties to the lowest row) -> *out, its value -> *value_out (if not NULL): the lm_head of
 * arc_model_forward_commit. Same limits. */
int arc_op_gemv_argmax(arc_context *ctx, const uint16_t *w, const float *x, int32_t rows, int32_t cols,
                       const uint16_t *norm_weight, float eps, float *y, int32_t *out, float *value_out);
/* y[rows] = silu(Wg @ n(x)) * (Wu @ n(x)), with w_gate_up = [Wg; Wu] (2 * rows, cols) and n as
 * in arc_op_gemv. Same limits. */
int arc_op_gemv_swiglu(arc_context *ctx, const uint16_t *w_gate_up, const float *x, int32_t rows,
                       int32_t cols, const uint16_t *norm_weight, float eps, float *y);

/* The quantized GEMVs: arc_op_gemv, arc_op_gemv_argmax and arc_op_gemv_swiglu over W held in `format` (a quantized
 * arc_format): rows rows of arc_format_row_bytes(format, cols) bytes each (for the swiglu, 2 * rows rows: the
 * gate's, then the up's), 16-byte aligned. The input is quantized per unit (see arc_format). cols % 32 == 0 (% 256
 * for the _K formats), cols <= 49152; otherwise the limits of the bf16 GEMVs. */
int arc_op_qgemv(arc_context *ctx, int32_t format, const void *w, const float *x, int32_t rows, int32_t cols,
                 const uint16_t *bias, const uint16_t *norm_weight, float eps, int32_t accumulate, float *y);
int arc_op_qgemv_argmax(arc_context *ctx, int32_t format, const void *w, const float *x, int32_t rows,
                        int32_t cols, const uint16_t *norm_weight, float eps, float *y, int32_t *out,
                        float *value_out);
int arc_op_qgemv_swiglu(arc_context *ctx, int32_t format, const void *w_gate_up, const float *x, int32_t rows,
                        int32_t cols, const uint16_t *norm_weight, float eps, float *y);
/* The decode's FFN over quantized weights: h = arc_op_qgemv_swiglu(gate_up, x, rows ffn_dim, cols dim), then
 * y += W_down @ h (down: dim rows of ffn_dim). Where ffn_dim % 128 == 0 and ffn_dim >= 12288 the SwiGLU GEMV hands
 * h to the down GEMV already quantized, as the forward does; h and y are the two calls' bits either way. */
int arc_op_qgemv_ffn(arc_context *ctx, int32_t gate_up_format, const void *w_gate_up, int32_t down_format,
                     const void *w_down, const float *x, int32_t dim, int32_t ffn_dim, const uint16_t *norm_weight,
                     float eps, float *h, float *y);
/* out[rows, cols] = the weights of W (in `format`) rounded to bf16: what the prefill's matrix products read of a
 * quantized tensor. out 16-byte aligned. */
int arc_op_dequantize(arc_context *ctx, int32_t format, const void *w, int32_t rows, int32_t cols, uint16_t *out);

/* The scratch arc_op_attention needs, in bytes. */
int arc_op_attention_scratch_bytes(int32_t n_heads, int32_t head_dim, int32_t max_seq, uint64_t *bytes);
/* One token's attention with its rotary embedding and KV-cache write: qkv = [q (n_heads, head_dim) | k (n_kv_heads,
 * head_dim) | v (n_kv_heads, head_dim)] float32, unrotated, as the QKV projection writes it. q and k are rotated
 * for position *pos (rotate-half RoPE: element i pairs with i + head_dim / 2, angle float(*pos) * inv_freq[i],
 * inv_freq float32 (head_dim / 2)); k and v, rounded to bf16, are stored at row *pos of k_cache and v_cache, each
 * (n_kv_heads, max_seq, head_dim); then out (n_heads, head_dim) = softmax(q k^T / sqrt(head_dim)) v over rows
 * 0..*pos, query head h reading kv head h / (n_heads / n_kv_heads). qkv is not written. A block takes the query heads
 * of one kv head (up to 16) and its share of the tiles of 64 positions up to *pos, on tensor cores: each cached
 * element is read once. Heads past 256 elements (up to 512, a multiple of 8) are attended in float32 on the SIMT
 * cores, the new row stored first and then read back, over the same division of the positions. head_dim even and
 * <= 512 (a multiple of 8 past 128), n_heads <= 1024, max_seq <= 1048576; caches 16-byte aligned (4-byte when
 * head_dim % 8 != 0). A position outside [0, max_seq) writes NaN to out and nothing to the caches. */
int arc_op_attention(arc_context *ctx, const float *qkv, const float *inv_freq, uint16_t *k_cache,
                     uint16_t *v_cache, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                     int32_t max_seq, const int32_t *pos, float *scratch, float *out);
/* arc_op_attention with gpt-oss's sinks, for one token or the speculative verify's rows: query head h's sink logit
 * sinks[h] (n_heads bf16 words, in the units of the scaled scores; NULL: none) joins its softmax's denominator alone,
 * out = sum_j exp(x_j) v_j / (sum_j exp(x_j) + exp(sinks[h])). rows 1: arc_op_attention's launch at *positions (done
 * unused, may be NULL). rows 2..8: the verify's, qkv (rows, n_heads + 2 n_kv_heads, head_dim): every row's k and v are
 * rotated and stored at its position (positions[rows], device memory) first, then each row attends as the one-row
 * launch does at its position, to the bit; out (rows, n_heads, head_dim), scratch rows times
 * arc_op_attention_scratch_bytes, done rows * n_heads zeroed uint32 tickets (left zeroed). Otherwise as
 * arc_op_attention. */
int arc_op_attention_sinks(arc_context *ctx, const float *qkv, int32_t rows, const int32_t *positions,
                           const float *inv_freq, uint16_t *k_cache, uint16_t *v_cache, int32_t n_heads,
                           int32_t n_kv_heads, int32_t head_dim, int32_t max_seq, const uint16_t *sinks,
                           float *scratch, uint32_t *done, float *out);

/* The prefill's kernels (the prefill launches the same launchers). */

/* c (m, n) = a (m, k) @ w (n, k)^T (+ bias[n]) (+ c if accumulate != 0): a and w bf16 (w a weight matrix as the
 * model stores it), c float32, on tensor cores with float32 sums. bias is optional (NULL), added before c.
 * k % 8 == 0, n <= 4194240; a and w 16-byte aligned, c 8-byte aligned and distinct from a and w. */
int arc_op_gemm_bf16(arc_context *ctx, const uint16_t *a, const uint16_t *w, int32_t m, int32_t n, int32_t k,
                     const uint16_t *bias, int32_t accumulate, float *c);

/* h (m, n) bf16 = silu(a @ Wg^T) * (a @ Wu^T), rounded to nearest even, where w_gate_up = [Wg; Wu] (2 * n, k) bf16.
 * n even, 2 * n <= 4194240, h 4-byte aligned and distinct from a; otherwise as arc_op_gemm_bf16. */
int arc_op_gemm_swiglu_bf16(arc_context *ctx, const uint16_t *a, const uint16_t *w_gate_up, int32_t m, int32_t n,
                            int32_t k, uint16_t *h);

/* arc_op_gemm_bf16 and arc_op_gemm_swiglu_bf16 over w packed in a quantized `format` (rows of k weights as
 * arc_format lays them out, k a multiple of the format's unit), read packed: each output equals, bit for bit, what
 * arc_op_dequantize then the bf16 product give. Fastest for short products (the prefill uses it up to 256 rows). */
int arc_op_gemm_q(arc_context *ctx, int32_t format, const uint16_t *a, const void *w, int32_t m, int32_t n, int32_t k,
                  const uint16_t *bias, int32_t accumulate, float *c);
int arc_op_gemm_swiglu_q(arc_context *ctx, int32_t format, const uint16_t *a, const void *w_gate_up, int32_t m,
                         int32_t n, int32_t k, uint16_t *h);

/* The scratch arc_op_prefill_attention needs for n queries from start, in bytes (0 while start + n <= 1024: the keys
 * are walked in segments of 1,024 positions, each query's merged in order; 0 for head_dim past 256, whose queries
 * each walk every key alone). */
int arc_op_prefill_attention_scratch_bytes(int32_t n_heads, int32_t head_dim, int32_t n, int32_t start,
                                           uint64_t *bytes);
/* Attention for n tokens at positions start..start+n-1 with their rotary embedding and KV-cache writes: qkv (n, q |
 * k | v) float32, each row as arc_op_attention reads it (unrotated). q and k are rotated at each token's position
 * as arc_op_attention rotates them; k and v, rounded to bf16, are stored at rows start..start+n-1 of k_cache and
 * v_cache (n_kv_heads, max_seq, head_dim); q, rounded to bf16, goes to q_scratch (n, n_heads, head_dim). Then out
 * (n, n_heads, head_dim) bf16 = softmax(q k^T / sqrt(head_dim)) v, the query at position p over cache rows 0..p
 * (the rows of earlier positions must have been written), query head h reading kv head h / (n_heads / n_kv_heads);
 * the probabilities are rounded to bf16 for the product with v (heads past 256 elements, up to 512 and a multiple of
 * 8, are attended in float32 on the SIMT cores from the bf16 q, each query alone over the cache, and only the output
 * is rounded). head_dim even and <= 512, n >= 1, start >= 0, start + n <= max_seq <= 1048576; the caches and
 * q_scratch 16-byte aligned (4-byte when head_dim % 8 != 0), out 4-byte aligned; scratch: device memory of
 * arc_op_prefill_attention_scratch_bytes (NULL where that is 0). */
int arc_op_prefill_attention(arc_context *ctx, const float *qkv, const float *inv_freq, uint16_t *k_cache,
                             uint16_t *v_cache, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                             int32_t max_seq, int32_t n, int32_t start, uint16_t *q_scratch, float *scratch,
                             uint16_t *out);
/* arc_op_prefill_attention with gpt-oss's sinks: query head h's sink logit sinks[h] (n_heads bf16 words, in the
 * units of the scaled scores; NULL: none, arc_op_prefill_attention's bits) joins its softmax's denominator alone. */
int arc_op_prefill_attention_sinks(arc_context *ctx, const float *qkv, const float *inv_freq, uint16_t *k_cache,
                                   uint16_t *v_cache, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                   int32_t max_seq, int32_t n, int32_t start, const uint16_t *sinks,
                                   uint16_t *q_scratch, float *scratch, uint16_t *out);

/* The speculative verify's products: y (m, rows) = w (rows, cols) @ n(x[i]) (+ bias) (+ y if accumulate) for the m
 * rows x[i] of x (m, cols), n as in arc_op_gemv (norm_weight NULL: n(x) = x), each weight read once for every row.
 * Row i of y has the bits arc_op_gemv gives for x[i] alone (the same sums in the same order). m 1..8, cols % 8 == 0;
 * w, x, y 16-byte aligned; with a norm, xn (m, cols) float32, 16-byte aligned, takes n(x). With w_gate_up = [Wg; Wu]
 * (2 rows, cols): y = silu(Wg n(x)) * (Wu n(x)), each row the bits of arc_op_gemv_swiglu's. */
int arc_op_gemv_rows(arc_context *ctx, const uint16_t *w, const float *x, int32_t m, int32_t rows, int32_t cols,
                     const uint16_t *bias, const uint16_t *norm_weight, float eps, int32_t accumulate, float *xn,
                     float *y);
int arc_op_gemv_rows_swiglu(arc_context *ctx, const uint16_t *w_gate_up, const float *x, int32_t m, int32_t rows,
                            int32_t cols, const uint16_t *norm_weight, float eps, float *xn, float *y);
/* arc_op_gemv_rows and arc_op_gemv_rows_swiglu over w in a quantized `format` (laid out as for arc_op_qgemv): row i
 * of y has the bits arc_op_qgemv (arc_op_qgemv_swiglu) gives for x[i] alone, each row's input quantized by that
 * GEMV's own staging and each unit's dot summed in its order. m 1..8, cols a multiple of the format's unit, w, x, y
 * 16-byte aligned; scratch: device memory of m x cols floats, 16-byte aligned, neither x nor y (the rows, normed and
 * quantized). */
int arc_op_qgemv_rows(arc_context *ctx, int32_t format, const void *w, const float *x, int32_t m, int32_t rows,
                      int32_t cols, const uint16_t *bias, const uint16_t *norm_weight, float eps, int32_t accumulate,
                      float *scratch, float *y);
int arc_op_qgemv_rows_swiglu(arc_context *ctx, int32_t format, const void *w_gate_up, const float *x, int32_t m,
                             int32_t rows, int32_t cols, const uint16_t *norm_weight, float eps, float *scratch,
                             float *y);

/* The ranking of a prompt's scores (arc_model_prompt_logprobs), as arc_loop_enqueue_logprobs ranks a step's: for each
 * row r < rows of logits (its first vocab of logits[r * stride ..]), the log-probability of targets[r] under
 * log_softmax (NaN for a target outside [0, vocab)) into logprob[r], and the top_n ids and values (value descending,
 * ties to the lower id; id -1 and -inf past the vocabulary) into top_ids, top_values[r][ARC_MAX_TOP_LOGPROBS].
 * rows >= 1, 1 <= vocab <= stride, 0 <= top_n <= ARC_MAX_TOP_LOGPROBS; scratch: device memory of
 * arc_op_row_logprobs_scratch_bytes(rows, vocab); the outputs may be mapped host memory. */
int arc_op_row_logprobs_scratch_bytes(int32_t rows, int32_t vocab, uint64_t *bytes);
int arc_op_row_logprobs(arc_context *ctx, const float *logits, int32_t rows, int64_t stride, int32_t vocab,
                        int32_t top_n, const int32_t *targets, float *scratch, float *logprob, int32_t *top_ids,
                        float *top_values);

/* One token's gated DeltaNet step of one layer (arc_model.h: ARC_OP_DN_STEP), as the decode launches it, at
 * position *pos: u, DN_IN's output row ((2 dn_k_heads + 2 dn_v_heads) dn_head_dim + 2 dn_v_heads floats: the
 * convolution's q, k and v inputs, z, then b and a per value head); the layer's DN_CONV (conv channels,
 * dn_conv_kernel), DN_A_LOG and DN_DT_BIAS (dn_v_heads), DN_NORM (dn_head_dim), bf16; state: the layer's slots as
 * arc_model_state lays them out (9 of them), the step reading slot *pos % 9 (zeros at position 0) and writing slot
 * (*pos + 1) % 9; out: the gated norm's output (dn_v_heads * dn_head_dim) float32. The config's dn_ fields and
 * rms_eps are read (dn_head_dim 128, a convolution of 2 to 4 taps). As in the decode, *pos and the slot it reads are
 * read before the launch waits on the kernel before it: that kernel must not write them. */
int arc_op_deltanet_step(arc_context *ctx, const arc_model_config *config, const float *u, const int32_t *pos,
                         const uint16_t *conv, const uint16_t *a_log, const uint16_t *dt_bias, const uint16_t *norm,
                         float *state, float *out);

/* The same layer over `rows` consecutive tokens at positions pos..pos + rows - 1, in one of the step's forms: u,
 * rows of DN_IN's output as above, one after another; the step's weights and slots, the launch reading slot pos % 9
 * and writing slot (pos + rows) % 9 alone; out: the rows' outputs (rows, dn_v_heads * dn_head_dim) float32. form 0:
 * a block a value head, the rows one after another (the forwards' form); 1: four blocks a head in a cluster
 * (compute capability 9.0 or more); 2: every row's inputs at once, then the rows through the state, then every
 * row's norm (16 rows or more; scratch: rows * S floats, S the convolution's channels plus 2 dn_v_heads, rounded up
 * to a multiple of 4; NULL for the other forms). Every form gives each row's output and the state at the end the
 * bits arc_op_deltanet_step gives the same rows one at a time. */
int arc_op_deltanet_rows(arc_context *ctx, const arc_model_config *config, int32_t form, const float *u, int32_t rows,
                         int32_t pos, const uint16_t *conv, const uint16_t *a_log, const uint16_t *dt_bias,
                         const uint16_t *norm, float *state, float *scratch, float *out);

/* arc-cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* ARC_OPS_H */
