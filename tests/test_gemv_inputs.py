"""The GPU tests' reference that rounds a quantized product's input as libarc's GEMVs do
(gemv_inputs.py): the rounding itself, and that it touches products over quantized matrices alone;
how far a preset's logits move with such roundings (gpt-oss-tiny's ten times as far as another
mixture's, gpt-oss-test's no further), and that gpt-oss-test's every gpt-oss feature moves them far
more than that."""

import dataclasses

import numpy as np
import pytest
from gemv_inputs import libarc_gemv_inputs, round_like_libarc

import arcpy.devices.reference_ops as reference_ops
from arcpy.codes import FORMAT_MXFP4
from arcpy.devices.reference import ReferenceModel
from arcpy.model import SHAPES, Model, preset_formats, preset_scales, random_model, synthetic_model
from arcpy.model.bf16 import bf16_to_f32, f32_to_bf16
from arcpy.model.native import expected_tensors, is_matrix
from arcpy.model.quant import FORMAT_NAMES


def test_each_32_values_round_at_127_over_their_largest():
    x = np.zeros(64, np.float32)
    x[:4] = [2.0, -1.0, 0.5 / 127 * 2, 0.3]   # amax 2: steps of 2 / 127
    x[32:34] = [-4.0, 4.0 * 63.5 / 127]       # a tie at 63.5 rounds to even, 64
    got = round_like_libarc(x)
    assert got[0] == 2.0 and got[1] == np.float32(-64 * (np.float32(2.0) / 127))
    assert got[3] == np.float32(19 * (np.float32(2.0) / 127)) and np.all(got[4:32] == 0)
    assert got[33] == np.float32(64 * (np.float32(4.0) / 127))


def test_only_products_over_quantized_matrices_round_their_input():
    cfg = SHAPES["gpt-oss-tiny"]
    q8 = {v: k for k, v in FORMAT_NAMES.items()}["Q8_0"]
    quantized = random_model(cfg, seed=5, formats={n: q8 for n in expected_tensors(cfg) if is_matrix(n)
                                                   and "experts." in n})
    before = ReferenceModel(quantized, max_seq=64).forward(1, 0)
    for model, moved in ((quantized, True), (synthetic_model("gpt-oss-tiny", seed=5), False)):
        plain = ReferenceModel(model, max_seq=64).forward(1, 0)
        with libarc_gemv_inputs():
            rounded = ReferenceModel(model, max_seq=64).forward(1, 0)
        assert (not np.array_equal(plain, rounded)) == moved
    assert np.array_equal(ReferenceModel(quantized, max_seq=64).forward(1, 0), before)  # restored on leaving


def _spread(shape: str) -> tuple[float, float]:
    """How far the reference's own logits move, with the routers' logits 16 times larger
    (test_gpu_moe.py's prefill), at worst over 8 prompts of 16 tokens: from float32 to the
    prefill's bf16 roundings; and at worst over 24 decode steps, from float32 inputs to the
    quantized GEMVs' rounding of the experts' inputs (Q8_0 experts; the rest of the preset's
    weights as it draws them, at its preset_scales)."""
    cfg = SHAPES[shape]
    q8 = {v: k for k, v in FORMAT_NAMES.items()}["Q8_0"]
    model = random_model(cfg, seed=5, formats={n: q8 for n in expected_tensors(cfg) if is_matrix(n)
                                               and "experts." in n}, scales=preset_scales(shape))
    for name in [n for n in model.tensors if n.endswith("mlp.gate.weight")]:
        model.tensors[name] = f32_to_bf16(bf16_to_f32(model.tensors[name]) * np.float32(16))
    rel = lambda got, want: float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))  # noqa: E731
    rng = np.random.default_rng(9)
    prefill = 0.0
    for _ in range(8):
        tokens = [int(t) for t in rng.integers(0, cfg.vocab, 16)]
        prefill = max(prefill, rel(ReferenceModel(model, max_seq=64).prefill(tokens, bf16_products=True),
                                   ReferenceModel(model, max_seq=64).prefill(tokens)))
    plain, decode, token = ReferenceModel(model, max_seq=64), 0.0, 1
    with libarc_gemv_inputs():
        inputs = ReferenceModel(model, max_seq=64)
        for pos in range(24):
            want = plain.forward(token, pos)
            decode = max(decode, rel(inputs.forward(token, pos), want))
            token = int(np.argmax(want))
    return prefill, decode


def test_gpt_oss_tiny_moves_with_a_rounding_far_more_than_another_mixture():
    """Why the GPU tests hold gpt-oss-test, not gpt-oss-tiny: gpt-oss-tiny's reference's own logits
    move several times as far as qwen3moe-tiny's with the same roundings (0.22 and 0.41 against
    0.024 and 0.026). An error in its embeddings is 87 times larger after its last layer (qwen3moe-
    tiny's 6 times), most of it from the attention: YaRN's factor (1.35) multiplies q and k on top
    of the presets' gain of 2, so the scores have a std of 7 (qwen3moe-tiny's, normed, 1), a relative
    error in q or k moves them 7 times as far, and a softmax that sharp passes it on (the first
    attention alone makes the error 4 times larger); q and k at unit scale bring the moves to 0.06
    and 0.08. Its experts add the rest: 0.9 to a residual of 2 (the routers' logits 16 times
    larger), where gpt-oss-test's add 0.3 to 1.2. Its clamp never acts (the GLU's inputs stay under
    5), nor do its sinks (a std of 0.5: under 2% of a softmax at 9 positions in 10); its biases and
    its logits' scale (3, as qwen3moe-tiny's) are not the cause."""
    oss, other = _spread("gpt-oss-tiny"), _spread("qwen3moe-tiny")
    print(f"gpt-oss-tiny {oss}, qwen3moe-tiny {other}")
    assert oss[0] > 3 * other[0] and oss[1] > 3 * other[1]


# How far a rounding may move a test preset's logits (_spread): qwen3moe-tiny's move 0.024 and 0.026.
SPREAD = 0.05


def test_gpt_oss_test_moves_with_a_rounding_no_further_than_another_mixture():
    """gpt-oss-test's weights, drawn at its preset_scales, move with those roundings about as far as
    qwen3moe-tiny's (measured 0.016 and 0.012; gpt-oss-tiny's fail this bound 4 and 8 times over),
    so that the GPU tests may hold it to the other mixtures' bounds."""
    oss = _spread("gpt-oss-test")
    print(f"gpt-oss-test {oss}")
    assert max(oss) <= SPREAD


def _without(model: Model, ends: tuple[str, ...] = (), value: float = 0.0, **change) -> Model:
    """`model` with the tensors named by `ends` all `value` and the config's fields `change`d."""
    tensors = dict(model.tensors)
    for name in [n for n in tensors if n.endswith(ends)] if ends else []:
        tensors[name] = f32_to_bf16(np.full(tensors[name].shape, value, np.float32))
    return Model(dataclasses.replace(model.config, **change), tensors, model.name, model.source)


@pytest.mark.parametrize("shape", ["gpt-oss-test", "gpt-oss-test-mxfp4"])
def test_every_gpt_oss_feature_moves_gpt_oss_tests_logits_far_more_than_a_rounding(shape, monkeypatch):
    """Each of gpt-oss's additions taken away moves gpt-oss-test's logits (the largest relative
    move over a prompt's 24 rows, each a decode step's logits) more than twice SPREAD, so that a
    device that dropped one would miss the GPU tests' bounds: the windows of 8 positions (shorter
    than the prompt), the sinks (at -30, weightless), each family of biases, the clamp (its limit
    raised to 1,000), the top 4 (the top 1 alone); measured 0.15 (the MXFP4 preset's router bias) to
    1.25. The clamp acts on some of the experts' gates and ups (4% and 8%); the routers' 4th logit
    leads the 5th by more than test_gpu_moe.py's ROUTE_GAP at most decode steps (29 and 23 of 48);
    the MXFP4 preset's experts are MXFP4."""
    model = synthetic_model(shape, seed=5, max_seq=64)
    cfg, prompt = model.config, [int(t) for t in np.random.default_rng(1).integers(0, 1024, 24)]
    assert [cfg.window(i) for i in range(cfg.n_layers)] == [8, 0, 8, 0] and len(prompt) > 8
    experts = [f for n, f in preset_formats(shape).items() if "experts." in n]
    assert shape.endswith("mxfp4") == all(f == FORMAT_MXFP4 for f in experts)
    counts, glu = np.zeros(3), reference_ops.clamped_swiglu  # the gates and the ups past the limit, of all

    def counted(gate, up, limit, alpha):
        counts[:] += [(gate > limit).sum(), (np.abs(up) > limit).sum(), gate.size]
        return glu(gate, up, limit, alpha)
    with monkeypatch.context() as m:
        m.setattr(reference_ops, "clamped_swiglu", counted)
        want = ReferenceModel(model).prefill(prompt, every_row=True)
    print(f"{shape}: clamped gates {counts[0] / counts[2]:.3f}, ups {counts[1] / counts[2]:.3f}")
    assert np.all(counts[:2] / counts[2] > 0.01)
    gone = {"windows": _without(model, sliding_window=0), "sinks": _without(model, ("self_attn.sinks",), -30.0),
            "q/k/v biases": _without(model, ("q_proj.bias", "k_proj.bias", "v_proj.bias")),
            "o bias": _without(model, ("o_proj.bias",)), "router bias": _without(model, ("mlp.gate.bias",)),
            "experts' biases": _without(model, ("experts.gate_proj.bias", "experts.up_proj.bias",
                                                "experts.down_proj.bias")),
            "clamp": _without(model, swiglu_limit=1000.0), "top 4": _without(model, n_experts_used=1)}
    for what, changed in gone.items():
        got = ReferenceModel(changed).prefill(prompt, every_row=True)
        move = max(float(np.abs(g - w).max()) / max(1.0, float(np.abs(w).max())) for g, w in zip(got, want))
        print(f"{shape} without its {what}: the logits move {move:.3f}")
        assert move > 2 * SPREAD, what
    ref, token, decided = ReferenceModel(model), 1, 0
    for pos in range(48):  # test_gpu_moe.py's decided_errors
        token = int(np.argmax(ref.forward(token, pos)))
        decided += min(ref.route_gap.values()) > 0.02
    print(f"{shape}: {decided} of 48 decode steps with their routing decided")
    assert decided >= 16
