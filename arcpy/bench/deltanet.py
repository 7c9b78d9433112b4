"""A hybrid's DeltaNet step timed alone (arc_op_deltanet_step, the decode's launcher), as the
kernel table (kernels.py) times the other kernels: a graph of one launch per DeltaNet layer, each
over its own layer's weights and state slots, replayed back to back. Its figure is the rate at
which one launch reads and writes its layer's state against the copy bandwidth: the state (2 to 3
MiB a layer at the real dims) is what such a layer streams a token besides its weights. Beside it,
the step in its other forms (arc_op_deltanet_rows): in clusters, and over one chunk of one layer."""

from __future__ import annotations

import statistics

import numpy as np

from arcpy import _lib
from arcpy.bench.kernels import Buffers, time_launches
from arcpy.devices.context import Context
from arcpy.errors import ArcError
from arcpy.model import ModelConfig, f32_to_bf16
from arcpy.model.hybrid import STATE_SLOTS, state_bytes_per_token
from arcpy.model.native import native_config


CHUNK_ROWS = 2048  # the prefill's chunk (cuda_model.PREFILL_CHUNK)


def bench_deltanet(cfg: ModelConfig, replays: int = 5) -> dict:
    """A hybrid's DeltaNet step alone (arc_op_deltanet_step, the decode's launcher): a graph of one
    launch per DeltaNet layer, each over its own layer's weights and state slots, at position 1 (a
    state read and written, as at any later position). `state_bytes` is what one launch reads and
    writes of its state (hybrid.state_bytes_per_token's share of a layer), the figure held to the
    copy bandwidth; `us` the median µs a launch (`cluster_us`: the same step in the clusters' form,
    arc_op_deltanet_rows' 1); `chunk_us` and `chunk_step_form_us` the median µs of
    arc_op_deltanet_rows over CHUNK_ROWS rows of one layer, in the rows' form (2) and in the
    forwards' (0)."""
    layers = sum(cfg.is_linear_layer(i) for i in range(cfg.n_layers))
    if not layers:
        raise ArcError(f"{cfg.n_layers} layers, none of them a DeltaNet layer")
    hd, nv, nk, kernel = cfg.linear_k_head_dim, cfg.linear_n_v_heads, cfg.linear_n_k_heads, cfg.linear_conv_kernel
    channels = (2 * nk + nv) * hd
    u_floats = channels + nv * hd + 2 * nv
    state = state_bytes_per_token(cfg) // layers
    with Context(0) as ctx:
        buf = Buffers(ctx)
        try:
            ffi, lib = buf.ffi, buf.lib
            c = native_config(ffi, cfg)
            f32 = lambda p: ffi.cast("float *", p)
            u16 = lambda p: ffi.cast("uint16_t *", p)
            u = f32(buf.upload(buf.rng.standard_normal(u_floats, dtype=np.float32)))
            conv, norm = buf.random_bf16(layers * channels * kernel * 2), buf.norms(layers, hd)
            a_log = buf.upload(f32_to_bf16(buf.rng.uniform(-1, 1, layers * nv).astype(np.float32)))
            dt_bias = buf.upload(f32_to_bf16(buf.rng.uniform(-1, 1, layers * nv).astype(np.float32)))
            slot = channels * (kernel - 1) + nv * hd * hd
            # arc_model_state's slots, of the pool's words: floats near 0.02 in size.
            states = buf.random_bf16(layers * STATE_SLOTS * slot * 4)
            pos = ffi.cast("int32_t *", buf.scalar(1, np.int32))
            out = f32(buf.floats(nv * hd))

            def layer(l: int) -> tuple:  # layer l's weights and slots, as both ops take them
                return (u16(conv) + l * channels * kernel, u16(a_log) + l * nv, u16(dt_bias) + l * nv,
                        u16(norm) + l * hd, f32(states) + l * STATE_SLOTS * slot)

            def op(l: int) -> int:
                return lib.arc_op_deltanet_step(ctx.ptr, c, u, pos, *layer(l), out)

            # The prefill's form (arc_op_deltanet_rows) over a chunk of CHUNK_ROWS rows of one layer.
            u_rows = f32(buf.upload(buf.rng.standard_normal(CHUNK_ROWS * u_floats, dtype=np.float32)))
            scratch = f32(buf.floats(CHUNK_ROWS * ((channels + 2 * nv + 3) // 4 * 4)))
            outs = f32(buf.floats(CHUNK_ROWS * nv * hd))

            def chunk(form: int) -> int:  # arc_op_deltanet_rows' 0 (the forwards' form) or 2 (the rows')
                return lib.arc_op_deltanet_rows(ctx.ptr, c, form, u_rows, CHUNK_ROWS, 1, *layer(0),
                                                scratch if form == 2 else ffi.NULL, outs)

            def in_clusters(l: int) -> int:  # the same step in the clusters' form (arc_op_deltanet_rows' 1)
                return lib.arc_op_deltanet_rows(ctx.ptr, c, 1, u, 1, 1, *layer(l), ffi.NULL, out)

            ctx.wait_idle()
            us = time_launches(ctx, [lambda l=l: _lib.check(op(l)) for l in range(layers)], replays)
            cluster_us = time_launches(ctx, [lambda l=l: _lib.check(in_clusters(l)) for l in range(layers)], replays)
            chunk_us = time_launches(ctx, [lambda: _lib.check(chunk(2))], replays)
            step_us = time_launches(ctx, [lambda: _lib.check(chunk(0))], max(1, replays // 2))
            return {"layers": layers, "state_bytes": state, "us": statistics.median(us),
                    "runs_us": [round(x, 3) for x in us], "cluster_us": statistics.median(cluster_us),
                    "chunk_rows": CHUNK_ROWS,
                    "chunk_us": statistics.median(chunk_us), "chunk_runs_us": [round(x, 2) for x in chunk_us],
                    "chunk_step_form_us": statistics.median(step_us)}
        finally:
            buf.free()


def format_deltanet(shape: dict, bandwidth_gbps: float) -> list[str]:
    """The DeltaNet step's row of a report (lines; none where the shape has no such row)."""
    d = shape.get("deltanet")
    if not d:
        return []
    if "error" in d:
        return [f"deltanet step, {shape['shape']}: FAILED: {d['error']}"]
    gbps = d["state_bytes"] / d["us"] / 1e3
    return [f"deltanet step alone, {shape['shape']}: {d['us']:.2f} us a launch x {d['layers']} layers, state "
            f"{d['state_bytes'] / 1e6:.2f} MB read and written a launch: {gbps:.0f} GB/s, {gbps / bandwidth_gbps:.1%} "
            "of copy bandwidth" + (f"; in the clusters' form {d['cluster_us']:.2f} us ("
                                    f"{d['state_bytes'] / d['cluster_us'] / 1e3 / bandwidth_gbps:.1%})"
                                    if "cluster_us" in d else "")] + ([
        f"deltanet chunk of {d['chunk_rows']} rows, {shape['shape']}: the rows' form {d['chunk_us']:.1f} us a "
        f"layer ({d['chunk_us'] / d['chunk_rows']:.3f} us a row), the forwards' {d['chunk_step_form_us']:.1f} us "
        f"({d['chunk_step_form_us'] / d['chunk_rows']:.3f} us a row)"] if "chunk_us" in d else [])
