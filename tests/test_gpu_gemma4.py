"""GPU tier: Gemma 4 where a GPU is present (marker `gpu`). libarc runs none of its layer's own parts
(arcpy/model/gemma4.py): the CUDA backend, which "auto" picks there, refuses the model in one line
that names the numpy backend, and nothing it allocated stays behind; the numpy backend runs it."""

import pytest

from arcpy import open_engine
from arcpy.devices.cuda import open_cuda_device
from arcpy.errors import InvalidArgumentError
from arcpy.model import synthetic_model
from arcpy.model.gemma4 import CUDA_REFUSAL

pytestmark = pytest.mark.gpu


def test_auto_refuses_gemma4_on_a_gpu_in_one_line_and_the_numpy_backend_runs_it():
    model = synthetic_model("gemma4-tiny", max_seq=64)
    with pytest.raises(InvalidArgumentError) as e:
        open_engine(model, "auto")
    assert str(e.value) == CUDA_REFUSAL and "--backend numpy" in str(e.value)
    with open_engine(model, "numpy") as engine:
        assert len(list(engine.generate([1, 2, 3], max_new_tokens=4))) == 4
    with open_cuda_device(synthetic_model("stories15M", max_seq=64), use_graph=False) as dev:  # the GPU as before
        assert dev is not None
