// graph.cu -- capture what is enqueued on a context's stream into a CUDA graph, instantiate it
// once, and replay it per step. A captured forward writes its logits to storage the next launch
// overwrites: only work enqueued on the same stream before that launch may read them (the
// sampler, a copy to pinned memory), never the host while steps are in flight.
#include <stdlib.h>

#include "internal.cuh"

extern "C" int arc_graph_capture_begin(arc_context *ctx) {
    ARC_REQUIRE(ctx, "ctx is null");
    ARC_REQUIRE(!ctx->capturing, "a capture is already in progress on this context");
    // Thread-local mode: a stray CUDA call from another thread cannot invalidate the capture.
    ARC_CUDA(ctx, cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal));
    ctx->capturing = true;
    ctx->capture_commits = nullptr;
    return ARC_OK;
}

extern "C" int arc_graph_capture_end(arc_context *ctx, arc_graph **out) {
    ARC_REQUIRE(ctx && out, "null argument");
    ARC_REQUIRE(ctx->capturing, "no capture in progress");
    *out = nullptr;
    ctx->capturing = false;
    arc_loop *commits = ctx->capture_commits;
    ctx->capture_commits = nullptr;
    cudaGraph_t graph = nullptr;
    ARC_CUDA(ctx, cudaStreamEndCapture(ctx->stream, &graph));
    // Counted here: the graph itself is destroyed once instantiated.
    size_t nodes = 0;
    cudaError_t err = cudaGraphGetNodes(graph, nullptr, &nodes);
    ctx->counters.cuda_calls++;
    if (err != cudaSuccess) {
        cudaGraphDestroy(graph);
        return arc_fail_cuda(err, "cudaGraphGetNodes", __func__);
    }
    cudaGraphExec_t exec = nullptr;
    err = cudaGraphInstantiate(&exec, graph, 0);
    ctx->counters.cuda_calls += 2;
    cudaGraphDestroy(graph);
    if (err != cudaSuccess) return arc_fail_cuda(err, "cudaGraphInstantiate", __func__);
    // Upload now so that the first replay does not pay for it.
    err = cudaGraphUpload(exec, ctx->stream);
    ctx->counters.cuda_calls++;
    if (err != cudaSuccess) {
        cudaGraphExecDestroy(exec);
        return arc_fail_cuda(err, "cudaGraphUpload", __func__);
    }
    arc_graph *g = (arc_graph *)calloc(1, sizeof *g);
    if (!g) {
        cudaGraphExecDestroy(exec);
        return arc_fail(ARC_OUT_OF_MEMORY, __func__, "host allocation failed");
    }
    g->ctx = ctx;
    g->exec = exec;
    g->commits = commits;
    g->node_count = nodes;
    *out = g;
    return ARC_OK;
}

extern "C" int arc_graph_launch(arc_graph *graph) {
    ARC_REQUIRE(graph, "graph is null");
    arc_context *ctx = graph->ctx;
    ARC_CUDA(ctx, cudaGraphLaunch(graph->exec, ctx->stream));
    ctx->counters.graph_launches++;
    return ARC_OK;
}

extern "C" int arc_graph_destroy(arc_graph *graph) {
    ARC_REQUIRE(graph, "graph is null");
    arc_context *ctx = graph->ctx;
    cudaGraphExec_t exec = graph->exec;
    free(graph);
    ARC_CUDA(ctx, cudaGraphExecDestroy(exec));
    return ARC_OK;
}

extern "C" int arc_graph_node_count(arc_graph *graph, uint64_t *count) {
    ARC_REQUIRE(graph && count, "null argument");
    *count = graph->node_count;
    return ARC_OK;
}
