// gemm_sm90.cuh -- the prefill's products on Hopper tensor cores (gemm_sm90.cu), for gemm.cu.
#pragma once

#include "gemm.cuh"
#include "internal.cuh"

// Whether gemm_sm90 runs on this context's device: an sm_90 GPU, and a library built with
// sm_90a code.
bool gemm_sm90_available(const arc_context *ctx);

// d = io.c (m, n) = a (m, k) . w (n, k)^T, plus d itself when accumulate; a and w bf16, d
// float32, all row-major and dense (no bias, ldc n). Limits: k % 8 == 0, n % 4 == 0, a, w and d
// 16-byte aligned.
int gemm_sm90(arc_context *ctx, const char *who, const uint16_t *w, const GemmIo &io);
