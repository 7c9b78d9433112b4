"""GPU tier (marker `gpu`): mixtures of experts have no kernels yet, so libarc refuses them at
arc_model_create in one line and hands back no model; the CUDA backend says the same line."""

import pytest

from arcpy.devices.cuda import open_cuda_device
from arcpy.errors import ArcError
from arcpy.model import SHAPES, synthetic_model
from arcpy.model.native import native_config

pytestmark = pytest.mark.gpu
REFUSAL = "mixture-of-experts layers are not implemented on the GPU yet"


@pytest.mark.parametrize("shape", ["qwen3moe-tiny", "mixtral-tiny"])
def test_arc_model_create_refuses_a_mixture_of_experts_in_one_line(gpu, shape):
    ffi, lib = gpu.ffi, gpu.lib
    out = ffi.new("arc_model **")
    status = lib.arc_model_create(gpu.ctx, native_config(ffi, SHAPES[shape], max_seq=64), out)
    assert status == lib.ARC_INVALID_ARGUMENT
    message = ffi.string(lib.arc_last_error()).decode()
    assert REFUSAL in message and "\n" not in message
    assert out[0] == ffi.NULL


def test_the_cuda_backend_refuses_an_moe_model_in_one_line():
    with pytest.raises(ArcError, match=REFUSAL) as e:
        open_cuda_device(synthetic_model("mixtral-tiny", max_seq=64), max_seq=64)
    assert "\n" not in str(e.value)
