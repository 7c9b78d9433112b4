// kernels.cuh -- what the attention kernels (attention.cu, verify_attention.cu,
// prefill_attention.cu) build on: the device arithmetic, the launch, the tensor-core primitives,
// and a layer's attention as the forwards launch it.
#pragma once

#include "device_math.cuh"
#include "launch.cuh"
#include "model/attention_ops.cuh"
#include "model/tensor_core.cuh"
