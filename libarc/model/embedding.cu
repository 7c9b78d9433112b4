// embedding.cu -- the first step of the forward: the token's row of the embedding table.
#include "embedding.cuh"
#include "launch.cuh"

enum { EMBED_THREADS = 256 };

// x[dim] = float(table[*token, :]) * scale, table bf16 (vocab, dim). One block of EMBED_THREADS; one
// thread reads the token (written by the kernel before) and shares it. A token outside
// [0, vocab) fills x with NaN instead of reading out of bounds (the commit kernel and
// a sequence's input, arc_loop_begin_sequence, never let one through). Limits: dim % 8 == 0, table and x 16-byte aligned.
__global__ void __launch_bounds__(EMBED_THREADS)
embedding_kernel(const uint16_t *__restrict__ table, int vocab, int dim,
                 const volatile uint32_t *token, float scale, float *__restrict__ x) {
    __shared__ uint32_t tok;
    pdl_launch_dependents();
    pdl_wait();  // the token may have been written by the kernel before
    if (threadIdx.x == 0) tok = *token;
    __syncthreads();
    embed_row(table, vocab, dim, tok, scale, x, EMBED_THREADS);
}

int embedding_scaled(arc_context *ctx, const EmbedTable &e, const uint32_t *token, float *x) {
    const uint16_t *table = e.table;
    const int32_t vocab = e.vocab, dim = e.dim;
    ARC_REQUIRE(ctx, "ctx is null");
    ARC_REQUIRE(table && token && x, "null pointer (table, token and x are required)");
    ARC_REQUIRE(vocab > 0, "vocab must be positive, got %d", vocab);
    ARC_REQUIRE(dim > 0 && dim % 8 == 0, "dim must be a positive multiple of 8, got %d", dim);
    ARC_REQUIRE((uintptr_t)table % 16 == 0, "table must be 16-byte aligned");
    ARC_REQUIRE((uintptr_t)x % 16 == 0, "x must be 16-byte aligned");
    return arc_launch_pdl(ctx, "embedding_kernel", embedding_kernel, dim3(1), dim3(EMBED_THREADS), 0, table, vocab,
                          dim, (const volatile uint32_t *)token, e.scale, x);
}

extern "C" int arc_op_embedding(arc_context *ctx, const uint16_t *table, int32_t vocab, int32_t dim,
                                const uint32_t *token, float *x) {
    return embedding_scaled(ctx, {.table = table, .vocab = vocab, .dim = dim, .scale = 1.0f}, token, x);
}

