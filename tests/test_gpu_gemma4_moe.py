"""GPU tier: Gemma 4's mixture of experts on libarc (marker `gpu`): the experts beside the dense FFN
(ARC_OP_EXPERTS_BESIDE; libarc/model/moe/moe.cu's moe_decode_beside and moe_prefill_beside), on
gemma4-moe-tiny, whose every layer runs 2 of 8 experts beside its GLU, and gemma4-tiny, which adds
per-layer embeddings and K/V shared by its last two layers. Their routers' weights are
scaled 256 times (a power of two, exact in bf16) so that most rows are routed with a clear lead
(on the CPU: every one of 48 greedy steps, and prompts of up to 64 rows among the first three drawn);
against the NumPy reference the logits are compared where every layer's routing is decided, as
test_gpu_moe.py compares every other mixture's: the decode steps, the prefill of 1 to 64 rows, the
prefill in chunks against at once, the replayed graph against the eager forward, the device loop
against the host path, greedy and sampled."""

import numpy as np
import pytest
import test_gpu_forward
import test_gpu_moe
from test_gpu_gemma4 import layer_checked  # noqa: F401  (the module's devices run the layer)

from arcpy.devices.cuda import open_cuda_device
from arcpy.model import gemma4, synthetic_model
from arcpy.model.bf16 import bf16_to_f32, f32_to_bf16

pytestmark = pytest.mark.gpu

SHAPE = "gemma4-moe-tiny"


def scaled_router(model, factor: float = 256.0):
    """`model` with every router's logits `factor` times larger."""
    for name in [n for n in model.tensors if n.endswith(gemma4.ROUTER)]:
        model.tensors[name] = f32_to_bf16(bf16_to_f32(model.tensors[name]) * np.float32(factor))
    return model


@pytest.fixture(scope="module", params=[SHAPE, "gemma4-tiny"])
def pair(request):
    model = scaled_router(synthetic_model(request.param, seed=5))
    dev = open_cuda_device(model, max_seq=1024)  # the graph test's positions reach 511
    yield model, dev
    dev.close()


decisive = pair  # the prefill test's fixture: the same routers, scaled

# test_gpu_moe.py's tests of every mixture, on this module's device.
test_the_decode_step_matches_the_reference_where_the_routing_is_decided = \
    test_gpu_moe.test_the_decode_step_matches_the_reference_where_the_routing_is_decided
test_the_device_loop_and_the_host_path_give_the_same_tokens = \
    test_gpu_moe.test_the_device_loop_and_the_host_path_give_the_same_tokens
test_the_prefill_matches_the_reference_with_bf16_products = \
    test_gpu_moe.test_the_prefill_matches_the_reference_with_bf16_products
test_the_prefill_in_chunks_gives_the_same_logits_as_at_once = \
    test_gpu_moe.test_the_prefill_in_chunks_gives_the_same_logits_as_at_once
test_graph_replay_equals_the_eager_forward_bit_for_bit = \
    test_gpu_forward.test_graph_replay_equals_the_eager_forward_bit_for_bit

