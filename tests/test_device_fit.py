"""A model whose weights and KV cache exceed the device's free memory is refused before anything is
allocated, in one line naming the bytes and the longest context that fits (arcpy.devices.cuda_model)."""

import pytest

from arcpy.devices.cuda_model import CudaModel, check_fits
from arcpy.model.hybrid import STATE_SLOTS, state_bytes_per_token
from arcpy.errors import InvalidArgumentError
from arcpy.model import synthetic_model

MODEL = synthetic_model("stories15M", seed=0)
CFG = MODEL.config
PER_POSITION = 2 * CFG.n_layers * CFG.n_kv_heads * CFG.head_dim * 2


def test_a_model_that_fits_passes():
    check_fits(MODEL, 1024, MODEL.stored_bytes + 1024 * PER_POSITION)


def test_a_context_too_long_names_the_bytes_and_the_longest_that_fits():
    with pytest.raises(InvalidArgumentError) as info:
        check_fits(MODEL, 1024, MODEL.stored_bytes + 100 * PER_POSITION + 5)
    msg = str(info.value)
    assert "\n" not in msg
    assert f"{1024 * PER_POSITION / 1e9:.2f} GB of bf16 KV cache for 1024 positions" in msg
    assert msg.endswith("lower --max-seq to at most 100")


def test_weights_that_do_not_fit_alone_say_so():
    with pytest.raises(InvalidArgumentError, match="its weights alone do not fit"):
        check_fits(MODEL, 16, MODEL.stored_bytes // 2)


class NoMemoryContext:
    """A context with nothing free, on which any allocation would fail loudly."""

    def memory(self):
        return 0, 80 * 10**9

    def __getattr__(self, name):
        raise AssertionError(f"the model touched the context's {name} before refusing")


def test_the_model_is_refused_before_anything_is_allocated():
    with pytest.raises(InvalidArgumentError, match="the device has 0.00 GB free"):
        CudaModel(NoMemoryContext(), MODEL, 64)


def test_a_hybrids_kv_cache_counts_its_attention_layers_alone():
    hybrid = synthetic_model("qwen3.5-tiny", seed=0)
    cfg = hybrid.config
    attending = [layer for layer in range(cfg.n_layers) if not cfg.is_linear_layer(layer)]
    assert 0 < cfg.kv_layers == len(attending) < cfg.n_layers
    per_position = 2 * cfg.kv_layers * cfg.n_kv_heads * cfg.head_dim * 2
    states = STATE_SLOTS * state_bytes_per_token(cfg) // 2  # the DeltaNet layers' slots
    check_fits(hybrid, 512, hybrid.stored_bytes + states + 512 * per_position)
    with pytest.raises(InvalidArgumentError, match=f"GB of weights, {states / 1e9:.2f} GB of DeltaNet states and .* "
                                                   "lower --max-seq to at most 511"):
        check_fits(hybrid, 512, hybrid.stored_bytes + states + 512 * per_position - 1)
