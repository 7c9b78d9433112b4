"""GPU tier: gpt-oss on libarc (marker `gpu`): its sinks, biases and clamped GLU in the decode step
and the prefill, on gpt-oss-test, the preset whose logits move with a rounding no further than other
mixtures' (tests/test_gpu_moe.py runs its presets through every MoE test); here the sinks
made large enough to take most of each head's weight, the layers' windows shorter than the
context, the refusal of a clamped GLU of other constants than libarc's, and a gpt-oss GGUF under
llama.cpp's names through `python -m arcpy.decode`."""

import dataclasses

import numpy as np
import pytest
from gemv_inputs import libarc_gemv_inputs
from test_gpu_moe import MAX_SEQ, assert_decode_paths_agree, decided_errors

from arcpy.devices.cuda import open_cuda_device
from arcpy.errors import InvalidArgumentError
from arcpy.model import Model, synthetic_model
from arcpy.model.bf16 import f32_to_bf16

pytestmark = pytest.mark.gpu


def heavy_sinks(model, value: float):
    """`model` with every sink logit `value` (plus a little noise): far above the scores, each
    head's positions share a small part of its weight, and a device that dropped the sink's term
    would be off by the whole attention output."""
    rng = np.random.default_rng(4)
    for name in [n for n in model.tensors if n.endswith("self_attn.sinks")]:
        n = model.tensors[name].shape[0]
        model.tensors[name] = f32_to_bf16(np.float32(value) + rng.standard_normal(n).astype(np.float32) * 0.25)
    return model


@pytest.mark.parametrize("shape", ["gpt-oss-test", "gpt-oss-test-mxfp4"])
@pytest.mark.parametrize("sink", [-30.0, 0.0, 4.0])
def test_the_decode_with_sinks_that_matter_matches_the_reference(shape, sink):
    model = heavy_sinks(synthetic_model(shape, seed=8), sink)
    assert model.config.sliding_window < 48  # the windowed layers drop positions within the run
    with open_cuda_device(model, max_seq=MAX_SEQ) as dev:
        errors = decided_errors(model, dev, steps=48, rounded=True)
    print(f"{shape}, sinks near {sink}: {len(errors)} decided steps, worst relative logit error {max(errors):.3g}")
    assert len(errors) >= 8 and max(errors) <= (8e-2 if "mxfp4" in shape else 1e-2)


def test_a_clamped_glu_of_other_constants_is_refused_in_one_line():
    base = synthetic_model("gpt-oss-test", seed=1)
    model = Model(dataclasses.replace(base.config, swiglu_limit=5.0), base.tensors, base.name, base.source)
    with pytest.raises(InvalidArgumentError) as e:
        open_cuda_device(model, max_seq=64)
    assert "limit 7" in str(e.value) and "\n" not in str(e.value)


BIASES = {"experts": ("experts.gate_proj.bias", "experts.up_proj.bias", "experts.down_proj.bias"),
          "o": ("o_proj.bias",), "router": ("mlp.gate.bias",), "qkv": ("q_proj.bias", "k_proj.bias", "v_proj.bias")}


@pytest.mark.parametrize("shape", ["gpt-oss-test", "gpt-oss-test-mxfp4"])
@pytest.mark.parametrize("zeroed", [None, "experts", "o", "router", "qkv", "sinks", "all"])
def test_a_one_token_prefill_matches_the_decode_and_the_reference(shape, zeroed):
    """One token at position 0 through the prefill and through the decode step, against the
    reference's bf16 prefill and its decode, with each family of gpt-oss's additions zeroed in turn
    (sinks: at -30, where they weigh nothing): the one whose removal brings the prefill back names
    where the prefill and the reference part."""
    from gpu_buffers import gpu_logits, host_logits
    from test_gpu_moe import device_tokens, prefill, rel_error

    from arcpy.devices.reference import ReferenceModel

    model = synthetic_model(shape, seed=5)
    for family, suffixes in BIASES.items():
        if zeroed in (family, "all"):
            for name in [n for n in model.tensors if n.endswith(suffixes)]:
                model.tensors[name] = np.zeros_like(model.tensors[name])
    if zeroed in ("sinks", "all"):
        heavy_sinks(model, -30.0)
    token = 7
    with open_cuda_device(model, max_seq=MAX_SEQ) as dev:
        decoded = gpu_logits(dev, token, 0)
        with device_tokens(dev, np.array([token], np.int32)) as d_tokens:
            prefill(dev, d_tokens, 1, 0)
            prefilled = host_logits(dev).copy()
    with libarc_gemv_inputs():  # the decode's quantized products round their input (gemv_inputs.py)
        want_decode = ReferenceModel(model, max_seq=MAX_SEQ).forward(token, 0)
    want_prefill = ReferenceModel(model, max_seq=MAX_SEQ).prefill([token], bf16_products=True)
    errors = {"decode": rel_error(decoded, want_decode), "prefill": rel_error(prefilled, want_prefill)}
    print(f"{shape}, zeroed {zeroed}: {errors}")
    assert errors["decode"] <= (8e-2 if "mxfp4" in shape else 1e-2) and errors["prefill"] <= 2e-2


@pytest.mark.parametrize("fmt", ["BF16", "Q8_0", "Q4_0", "MXFP4"])
def test_the_decode_with_experts_of_each_format_matches_the_reference(fmt):
    """gpt-oss-test with its experts alone in one format (the rest bf16), against a reference that
    rounds the quantized products' input as the device does (without it the reference's logits move
    by up to 0.009 over the decided steps, on the CPU: gemv_inputs.py; gpt-oss-tiny's by 0.16).
    Quantized: the bound of every quantized model, 8e-2 (gpt-oss-tiny on an H100, 2026-12-07: Q8_0
    0.027, Q4_0 0.007, MXFP4 0.015; bf16 9.8e-4)."""
    from arcpy.model import SHAPES, preset_scales, random_model
    from arcpy.model.native import expected_tensors, is_matrix
    from arcpy.model.quant import FORMAT_NAMES

    cfg = SHAPES["gpt-oss-test"]
    code = {v: k for k, v in FORMAT_NAMES.items()}.get(fmt)
    formats = {n: code for n in expected_tensors(cfg) if is_matrix(n) and "experts." in n} if code else None
    model = random_model(cfg, seed=5, name=f"experts-{fmt}", formats=formats, scales=preset_scales("gpt-oss-test"))
    with open_cuda_device(model, max_seq=MAX_SEQ) as dev:
        errors = decided_errors(model, dev, steps=48, rounded=True)
    print(f"gpt-oss-test, experts {fmt}: {len(errors)} decided steps, worst relative logit error {max(errors):.3g}")
    assert len(errors) >= 8 and max(errors) <= (1e-2 if fmt == "BF16" else 8e-2)


def test_decode_runs_a_gpt_oss_gguf_with_mxfp4_experts_on_the_gpu(tmp_path):
    """`python -m arcpy.decode --model FILE.gguf`: a gpt-oss file written as llama.cpp's converter
    writes one (its names and metadata keys, the experts in MXFP4) decodes on the CUDA backend, the
    device loop and the host path giving the same tokens."""
    from gguf import GGMLQuantizationType as Q
    from test_gguf import write_gguf
    from test_gpt_oss import V, converter_tensors, gpt_oss_meta

    from arcpy.model import SHAPES, preset_scales, random_model

    cfg = dataclasses.replace(SHAPES["gpt-oss-test"], vocab=V, max_seq=128)
    tensors = converter_tensors(random_model(cfg, seed=7, scales=preset_scales("gpt-oss-test")))
    path = write_gguf(tmp_path / "oss.gguf", tensors, gpt_oss_meta(cfg), "gpt-oss",
                      {name: Q.MXFP4 for name in tensors if "_exps.weight" in name})
    assert_decode_paths_agree(path)
