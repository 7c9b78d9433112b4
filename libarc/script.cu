// script.cu -- the scripted model: a stand-in forward whose argmax is a known function of
// (token, position). It reads both exactly as the real forward does (from the loop's device
// state), so the device loop can be tested, captured and replayed without a transformer; its
// modes inject the faults the loop must detect.
#include "internal.cuh"

// logits[vocab]: a deterministic value in [0, 1) per index, and 2.0 at the target.
// Grid: ceil(vocab / 256) blocks of 256 threads.
__global__ void script_kernel(const uint32_t *token_in, const int32_t *position,
                              arc_script s, float *logits) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    long long tok = (long long)*token_in;
    long long pos = *position;
    if (i == 0 && pos == s.at_pos) {
        if (s.mode == ARC_SCRIPT_ILLEGAL_ADDRESS) {
            *(volatile float *)(uintptr_t)0x10 = 1.0f;
        } else if (s.mode == ARC_SCRIPT_SPIN) {
            while (*(volatile const uint32_t *)s.flag == 0) __nanosleep(1000);
        }
    }
    if (i >= s.vocab) return;
    long long target = (tok * s.mul + pos * s.add + s.bias) % s.vocab;
    if (target < 0) target += s.vocab;
    if (s.mode == ARC_SCRIPT_TOKEN && pos == s.at_pos) target = s.bias;
    unsigned h = (unsigned)i * 2654435761u ^ (unsigned)(tok * 40503 + pos * 9973);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    logits[i] = i == target ? 2.0f : (float)(h >> 8) * (1.0f / 16777216.0f);
}

extern "C" int arc_script_forward(arc_loop *loop, const arc_script *script, float *logits) {
    ARC_REQUIRE(loop && script && logits, "null argument");
    ARC_REQUIRE(script->vocab > 0, "vocab must be positive, got %d", script->vocab);
    ARC_REQUIRE(script->mode >= ARC_SCRIPT_NORMAL && script->mode <= ARC_SCRIPT_TOKEN,
                "unknown script mode %d", script->mode);
    ARC_REQUIRE(script->mode != ARC_SCRIPT_SPIN || script->flag, "spin mode needs a flag");
    ARC_REQUIRE(script->mode != ARC_SCRIPT_TOKEN || (script->bias >= 0 && script->bias < script->vocab),
                "token mode needs bias in [0, vocab)");
    arc_context *ctx = loop->ctx;
    int blocks = (script->vocab + 255) / 256;
    script_kernel<<<blocks, 256, 0, ctx->stream>>>(&loop->state->token, &loop->state->position,
                                                   *script, logits);
    ARC_LAUNCHED(ctx, "script_kernel");
    return ARC_OK;
}
