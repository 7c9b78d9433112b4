// layer.cu -- the layer program (arc.h: arc_layer_op): the ops of a layer, and the data that
// differ from layer to layer (the window). layer.cuh's run_layers walks it for every forward; the
// NumPy reference reads it through arc_layer_program.
#include "layer.cuh"

int layer_program(const arc_model_config &c, int layer, int32_t *ops) {
    (void)layer;  // every layer of today's families runs the same ops; their data differ (RoPE, window)
    int n = 0;
    ops[n++] = ARC_OP_ATTN_IN;
    if (c.qk_norm) ops[n++] = ARC_OP_QK_NORM;
    ops[n++] = ARC_OP_ATTEND;
    ops[n++] = c.post_norms ? ARC_OP_ATTN_OUT_NORM : ARC_OP_ATTN_OUT;
    ops[n++] = ARC_OP_FFN_IN;
    ops[n++] = c.post_norms ? ARC_OP_FFN_OUT_NORM : ARC_OP_FFN_OUT;
    return n;
}

int layer_window(const arc_model_config &c, int layer) {
    if (c.sliding_window <= 0) return 0;
    const bool global = c.window_pattern > 0 && layer % c.window_pattern == c.window_pattern - 1;
    return global ? 0 : c.sliding_window;
}

extern "C" int arc_layer_program(const arc_model_config *config, int32_t layer, int32_t *ops, int32_t *count) {
    ARC_REQUIRE(config && ops && count, "null argument");
    // Only what the program reads is checked: a shape the kernels cannot run still has a program.
    ARC_REQUIRE(config->qk_norm == 0 || config->qk_norm == 1, "config.qk_norm must be 0 or 1, got %d", config->qk_norm);
    ARC_REQUIRE(config->post_norms == 0 || config->post_norms == 1, "config.post_norms must be 0 or 1, got %d",
                config->post_norms);
    ARC_REQUIRE(layer >= 0 && layer < config->n_layers, "layer must be in [0, %d), got %d", config->n_layers, layer);
    *count = layer_program(*config, layer, ops);
    return ARC_OK;
}
