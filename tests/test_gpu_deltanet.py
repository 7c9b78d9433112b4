"""GPU tier: the gated DeltaNet step alone (arc_op_deltanet_step, the decode's launcher, which the
bench's `deltanet step alone` row times) against the NumPy reference's step (arcpy/devices/deltanet.py)
over positions 0..15 of one state: its slots by position, the convolution's inputs and every value
head's S, and the gated norm's output; a chunk's rows in each form of the step (arc_op_deltanet_rows) against the
step's bits (marker `gpu`)."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_buffers import assert_close, f32p, u16p

from arcpy import _lib
from arcpy.devices.deltanet import DeltaNet, DeltaNetState, _sigmoid, _softplus, conv_dim
from arcpy.model import SHAPES, bf16_to_f32, random_model
from arcpy.model.hybrid import STATE_SLOTS as SLOTS
from arcpy.model.native import native_config

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("shape", ["qwen3.5-tiny", "qwen3.5moe-tiny"])
def test_the_deltanet_step_alone_follows_the_reference_over_its_slots(gpu, shape):
    cfg = SHAPES[shape]
    model = random_model(cfg, seed=2)
    layer = next(i for i in range(cfg.n_layers) if cfg.is_linear_layer(i))
    prefix = f"model.layers.{layer}.linear_attn."
    words = {name[len(prefix):]: w for name, w in model.tensors.items() if name.startswith(prefix)}
    dn = DeltaNet(cfg, lambda name: bf16_to_f32(words[name]))
    state = DeltaNetState(cfg)
    nv, hd, ch = cfg.linear_n_v_heads, cfg.linear_v_head_dim, conv_dim(cfg)
    slot = ch * (cfg.linear_conv_kernel - 1) + nv * hd * hd
    c = native_config(gpu.ffi, cfg)
    weights = [gpu.upload(np.ascontiguousarray(words[n]).ravel()) for n in ("conv1d.weight", "A_log", "dt_bias",
                                                                              "norm.weight")]
    states = gpu.upload(np.full(SLOTS * slot, np.nan, np.float32))  # position 0 must read none of it
    u_dev, out = gpu.alloc((ch + nv * hd + 2 * nv) * 4), gpu.alloc(nv * hd * 4)
    pos = gpu.alloc(4)
    rng = np.random.default_rng(4)
    for p in range(16):
        u = rng.standard_normal(ch + nv * hd + 2 * nv).astype(np.float32)
        gpu.put(u_dev, u)
        gpu.put(pos, np.array([p], np.int32))
        _lib.check(gpu.lib.arc_op_deltanet_step(gpu.ctx, c, f32p(gpu, u_dev), gpu.ffi.cast("int32_t *", pos),
                                                *(u16p(gpu, w) for w in weights), f32p(gpu, states), f32p(gpu, out)))
        qkv, z, b, a = np.split(u, [ch, ch + nv * hd, ch + nv * hd + nv])
        projected = (qkv[None], z[None], _sigmoid(b)[None], (dn.a * _softplus(a + dn.dt_bias))[None])
        want = dn.step_rows(projected, state, np.array([p]))
        assert_close(f"out at position {p}", gpu.read(out, np.float32, nv * hd), want, atol=2e-5, rtol=1e-4)
        written = gpu.read(gpu.ffi.cast("float *", states) + (p + 1) % SLOTS * slot, np.float32, slot)
        conv, s = written[:state.conv.size], written[state.conv.size:]
        assert_close(f"convolution inputs after position {p}", conv, state.conv, atol=0, rtol=0)
        assert_close(f"S after position {p}", s, state.s, atol=2e-6, rtol=1e-4)


def test_a_deltanet_step_of_unsupported_heads_is_refused_in_one_line(gpu):
    cfg = SHAPES["qwen3.5-tiny"]
    c = native_config(gpu.ffi, cfg)
    c.dn_head_dim = 64
    buf = gpu.alloc(1 << 20)
    status = gpu.lib.arc_op_deltanet_step(gpu.ctx, c, f32p(gpu, buf), gpu.ffi.cast("int32_t *", buf),
                                          *(u16p(gpu, buf) for _ in range(4)), f32p(gpu, buf), f32p(gpu, buf))
    message = gpu.ffi.string(gpu.lib.arc_last_error()).decode()
    assert status != 0 and "dn_head_dim must be 128" in message and "\n" not in message


@pytest.mark.parametrize("shape", ["qwen3.5-tiny", "qwen3.5moe-tiny"])
@pytest.mark.parametrize("start,rows", [(0, 40), (5, 18), (23, 16)])
@pytest.mark.parametrize("form", [0, 1, 2], ids=["head block", "cluster", "rows"])
def test_a_chunk_gives_each_row_and_the_state_the_steps_bits(gpu, shape, start, rows, form):
    """arc_op_deltanet_rows in each form (0: a block a head, deltanet.cu, the forwards'; 1: four blocks a head in
    a cluster, deltanet_cluster.cu; 2: the rows' form with a scratch, deltanet_rows.cu) against arc_op_deltanet_step
    run on the same rows one at a time: every output and the state at the chunk's end bit for bit; the slots it must
    not write untouched. 18 rows from position 5 end in the slot they start from."""
    cfg = SHAPES[shape]
    model = random_model(cfg, seed=3)
    layer = next(i for i in range(cfg.n_layers) if cfg.is_linear_layer(i))
    prefix = f"model.layers.{layer}.linear_attn."
    weights = [gpu.upload(np.ascontiguousarray(model.tensors[prefix + n]).ravel())
               for n in ("conv1d.weight", "A_log", "dt_bias", "norm.weight")]
    nv, hd, ch = cfg.linear_n_v_heads, cfg.linear_v_head_dim, conv_dim(cfg)
    width = ch + nv * hd + 2 * nv
    slot = ch * (cfg.linear_conv_kernel - 1) + nv * hd * hd
    c = native_config(gpu.ffi, cfg)
    rng = np.random.default_rng(start + rows)
    u = rng.standard_normal((start + rows, width)).astype(np.float32)
    u[:, ch + nv * hd:] *= 2.0  # b and a: betas and decays across their range
    stepped, formed = (gpu.upload(np.full(SLOTS * slot, np.nan, np.float32)) for _ in range(2))
    u_dev, out, pos = gpu.alloc(width * 4), gpu.alloc(nv * hd * 4), gpu.alloc(4)

    def step(states, p):
        gpu.put(u_dev, u[p])
        gpu.put(pos, np.array([p], np.int32))
        _lib.check(gpu.lib.arc_op_deltanet_step(gpu.ctx, c, f32p(gpu, u_dev), gpu.ffi.cast("int32_t *", pos),
                                                *(u16p(gpu, w) for w in weights), f32p(gpu, states), f32p(gpu, out)))
        return gpu.read(out, np.float32, nv * hd)

    for p in range(start):  # the state the chunk starts from, in both
        step(stepped, p), step(formed, p)
    before = gpu.read(formed, np.float32, SLOTS * slot).reshape(SLOTS, slot)
    want = np.stack([step(stepped, p) for p in range(start, start + rows)])
    rows_dev = gpu.upload(np.ascontiguousarray(u[start:]).ravel())
    scratch_row = (ch + 2 * nv + 3) // 4 * 4
    scratch = f32p(gpu, gpu.upload(np.full(rows * scratch_row, np.nan, np.float32))) if form == 2 else gpu.ffi.NULL
    outs = gpu.alloc(rows * nv * hd * 4)
    status = gpu.lib.arc_op_deltanet_rows(gpu.ctx, c, form, f32p(gpu, rows_dev), rows, start,
                                          *(u16p(gpu, w) for w in weights), f32p(gpu, formed), scratch, f32p(gpu, outs))
    if status and form == 1 and "needs compute capability 9.0" in gpu.ffi.string(gpu.lib.arc_last_error()).decode():
        pytest.skip("the clusters' form needs compute capability 9.0 or more")
    _lib.check(status)
    got = gpu.read(outs, np.float32, rows * nv * hd).reshape(rows, nv * hd)
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    assert not len(bad), (f"{len(bad)} outputs differ from the step's bits, the first at row {bad[0][0]}: "
                          f"{got[tuple(bad[0])]!r} against {want[tuple(bad[0])]!r}")
    after = gpu.read(formed, np.float32, SLOTS * slot).reshape(SLOTS, slot)
    end = (start + rows) % SLOTS
    ref = gpu.read(stepped, np.float32, SLOTS * slot).reshape(SLOTS, slot)[end]
    assert np.array_equal(after[end].view(np.uint32), ref.view(np.uint32)), "the state at the chunk's end differs"
    others = [i for i in range(SLOTS) if i != end]
    assert np.array_equal(after[others].view(np.uint32), before[others].view(np.uint32)), "another slot was written"


@pytest.mark.parametrize("form, rows, scratch, says", [(2, 15, True, "(16 or more in the rows' form)"),
                                                     (2, 16, False, "the rows' form (2) takes a scratch"),
                                                     (3, 16, True, "form must be 0, 1 or 2, got 3")])
def test_a_form_it_cannot_run_is_refused_in_one_line(gpu, form, rows, scratch, says):
    c = native_config(gpu.ffi, SHAPES["qwen3.5-tiny"])
    buf = gpu.alloc(1 << 20)
    status = gpu.lib.arc_op_deltanet_rows(gpu.ctx, c, form, f32p(gpu, buf), rows, 0,
                                          *(u16p(gpu, buf) for _ in range(4)), f32p(gpu, buf),
                                          f32p(gpu, buf) if scratch else gpu.ffi.NULL, f32p(gpu, buf))
    message = gpu.ffi.string(gpu.lib.arc_last_error()).decode()
    assert status != 0 and says in message and "\n" not in message
