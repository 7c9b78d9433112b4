"""GPU tier: gpt-oss on a machine with a GPU (marker `gpu`). libarc has no ops for its sinks, biases
and clamped GLU (arcpy/model/gpt_oss.py): the CUDA backend refuses the model in one line, before
it makes a context, and a model it runs opens after the refusal as before."""

import pytest

from arcpy.devices.cuda import open_cuda_device
from arcpy.errors import InvalidArgumentError
from arcpy.model import synthetic_model
from arcpy.model.gpt_oss import cuda_refusal

pytestmark = pytest.mark.gpu


def test_the_cuda_backend_refuses_gpt_oss_in_one_line_and_opens_the_next_model():
    model = synthetic_model("gpt-oss-tiny", max_seq=64)
    with pytest.raises(InvalidArgumentError) as e:
        open_cuda_device(model)
    assert str(e.value) == cuda_refusal(model.config) and "\n" not in str(e.value)
    with open_cuda_device(synthetic_model("stories15M", max_seq=64), use_graph=False) as dev:
        assert dev is not None
