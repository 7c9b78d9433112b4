"""An install built with ARC_CUDA_ARCHS=none: arcpy.model.table answers libarc's tensor table and
layer program in Python, the same as libarc.so does (checked here over every preset, the family
fixtures and variants of them, errors word for word); and a package without libarc.so imports,
decodes on the NumPy backend, and says in one line that the CUDA backend was not built."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from arcpy import _lib
from arcpy.errors import ArcError
from arcpy.model import SHAPES, ModelConfig, config_from_hf, table
from arcpy.model.native import config_values

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

needs_libarc = pytest.mark.skipif(_lib.not_built(), reason="the comparison needs libarc.so, which was not built")


def libarc_answer(values: dict, call):
    """libarc's answer for a config given by its fields: the value, or the error's text."""
    ffi, lib = _lib.load()
    c = ffi.new("arc_model_config *")
    for name, value in values.items():
        if name == "dense_layers":
            c.dense_layers[0:4] = value
        else:
            setattr(c, name, value)
    try:
        return call(ffi, lib, c)
    except ArcError as exc:
        return str(exc)


def table_answer(call):
    try:
        return call()
    except ArcError as exc:
        return str(exc)


def libarc_shape(values, tensor, layer):
    def call(ffi, lib, c):
        rows, cols = ffi.new("int64_t *"), ffi.new("int64_t *")
        _lib.check(lib.arc_tensor_shape(c, getattr(lib, tensor), layer, rows, cols))
        return int(rows[0]), int(cols[0])
    return libarc_answer(values, call)


def libarc_program(values, layer):
    def call(ffi, lib, c):
        ops, count = ffi.new("int32_t[]", lib.ARC_MAX_LAYER_OPS), ffi.new("int32_t *")
        _lib.check(lib.arc_layer_program(c, layer, ops, count))
        return [int(op) for op in ops[0:count[0]]]
    return libarc_answer(values, call)


def variants(cfg: ModelConfig):
    """cfg, and cfg with each feature the tables read switched (those ModelConfig accepts)."""
    yield cfg
    changes = [dict(qk_norm=not cfg.qk_norm), dict(qkv_bias=not cfg.qkv_bias),
               dict(tied_embeddings=not cfg.tied_embeddings), dict(post_norms=not cfg.post_norms),
               dict(rope_dim=cfg.head_dim // 2 - (cfg.head_dim // 2) % 2)]
    if cfg.n_experts:
        changes += [dict(moe_every=2), dict(mlp_only_layers=(0,)), dict(shared_expert_ffn_dim=0),
                    dict(shared_expert_ffn_dim=cfg.expert_ffn_dim)]
    for change in changes:
        try:
            yield dataclasses.replace(cfg, **change)
        except (ArcError, ValueError, TypeError):
            continue


def configs():
    found = dict(SHAPES)
    for folder in sorted([*(DATA / "families").iterdir(), *(DATA / "moe").iterdir()]):
        if (folder / "config.json").is_file():
            found[folder.name] = config_from_hf(json.loads((folder / "config.json").read_text()), folder.name)
    return found


@needs_libarc
@pytest.mark.parametrize("name", sorted(configs()))
def test_the_python_tables_answer_as_libarc_does(name):
    for cfg in variants(configs()[name]):
        values = config_values(cfg)
        for t, tensor in enumerate(table.TENSORS):
            assert getattr(_lib.load()[1], f"ARC_TENSOR_{tensor}") == t
            for layer in {0, 1, cfg.n_layers - 1, cfg.n_layers}:  # the last one: out of range
                want = libarc_shape(values, f"ARC_TENSOR_{tensor}", layer)
                assert table_answer(lambda: table.tensor_shape(values, f"ARC_TENSOR_{tensor}", layer)) == want, (
                    name, cfg, tensor, layer)
        for layer in range(-1, cfg.n_layers + 1):
            assert table_answer(lambda: table.layer_program(values, layer)) == libarc_program(values, layer)


MOE = dict(n_experts=4, n_experts_used=2, expert_ffn_dim=8)
BESIDE = {**MOE, "experts_beside": 1, "post_norms": 1, "norm_topk": 1}  # Gemma 4's experts beside the FFN


@needs_libarc
@pytest.mark.parametrize("change, says", [
    (dict(n_experts=-1), "n_experts must not be negative"), ({**MOE, "n_experts_used": 0}, "n_experts_used"),
    ({**MOE, "n_experts_used": 5}, "n_experts_used"), ({**MOE, "expert_ffn_dim": 0}, "expert_ffn_dim"),
    ({**MOE, "routing": 2}, "routing"), ({**MOE, "norm_topk": 2}, "norm_topk"), ({**MOE, "moe_every": -1}, "moe_every"),
    ({**MOE, "shared_ffn_dim": -1}, "shared_ffn_dim"), ({**MOE, "post_norms": 1}, "post_norms and mixture"),
    (dict(dim=0), "must be positive"), (dict(vocab=-3), "must be positive"), (dict(rope_dim=3), "rope_dim"),
    (dict(rope_dim=1024), "rope_dim"), (dict(qk_norm=2), "qk_norm"), (dict(post_norms=3), "post_norms"),
    (dict(experts_beside=2), "experts_beside must be 0 or 1"), ({**BESIDE, "post_norms": 0}, "experts_beside takes"),
    ({**BESIDE, "routing": 1}, "experts_beside takes"), ({**BESIDE, "norm_topk": 0}, "experts_beside takes"),
    ({**BESIDE, "shared_ffn_dim": 8}, "experts_beside takes"), ({**BESIDE, "expert_bias": 1}, "experts_beside takes"),
    (dict(ple_dim=-8, ple_vocab=16), "ple_dim and ple_vocab"), (dict(ple_dim=8), "ple_dim and ple_vocab"),
    (dict(kv_shared_layers=6), "kv_shared_layers must be in"), (dict(kv_shared_layers=-1), "kv_shared_layers"),
    (dict(sliding_window=4, window_pattern=2, kv_shared_layers=5), "shared layer 1 has no earlier layer"),
    (dict(double_wide_ffn=1), "double_wide_ffn"), (dict(kv_shared_layers=2, double_wide_ffn=2), "double_wide_ffn"),
])
def test_the_python_tables_refuse_what_libarc_refuses_in_its_words(change, says):
    values = {**config_values(SHAPES["stories15M"]), **change}
    for tensor in ("ARC_TENSOR_EMBED", "ARC_TENSOR_WQ", "ARC_TENSOR_MOE_GATE"):
        want = libarc_shape(values, tensor, 0)
        assert table_answer(lambda: table.tensor_shape(values, tensor, 0)) == want
    assert table_answer(lambda: table.layer_program(values, 0)) == libarc_program(values, 0)
    refused = [libarc_shape(values, "ARC_TENSOR_WQ", 0), libarc_program(values, 0)]
    assert any(isinstance(r, str) and r.startswith("invalid argument: ") and says in r for r in refused), refused


def cpu_only_package(tmp_path: Path) -> Path:
    """A copy of the package as ARC_CUDA_ARCHS=none installs it: no libarc.so nor its headers,
    libarc.skipped in its place."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "arcpy", site / "arcpy", ignore=shutil.ignore_patterns(
        "__pycache__", "libarc.so", "arc*.h", ".libarc-build"))
    (site / "arcpy" / _lib.SKIPPED).write_text("ARC_CUDA_ARCHS=none: libarc.so was not built\n")
    return site


def test_a_cpu_only_install_decodes_and_says_the_cuda_backend_was_not_built(tmp_path):
    site = cpu_only_package(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "ARC_LIBRARY"}
    env.update(PYTHONPATH=str(site), ARC_OFFLINE="1")

    def run(*args):
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=300)

    where = run("-c", "import arcpy, arcpy._lib as l; print(arcpy.__file__, l.not_built(), arcpy.cuda_status())")
    assert where.stdout.split(" ", 2) == [str(site / "arcpy" / "__init__.py"), "True", _lib.NOT_BUILT + "\n"]
    out = run("-m", "arcpy.decode", "-n", "8", "--shape", "qwen3moe-tiny", "--prompt-ids", "1 2 3")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == 8 and f"slow ({_lib.NOT_BUILT})" in out.stderr
    inside = subprocess.run([sys.executable, "-m", "arcpy.decode", "-n", "8", "--shape", "qwen3moe-tiny",
                             "--prompt-ids", "1 2 3"], capture_output=True, text=True, timeout=300)
    assert out.stdout == inside.stdout  # the Python tables decode what libarc's do
    assert run("-m", "arcpy", "smoke", "-n", "4").returncode == 0
    for args in (["-m", "arcpy.decode", "-n", "2", "--backend", "cuda"], ["-m", "arcpy", "info"],
                 ["-m", "arcpy.build_flags", "--libs"]):
        out = run(*args)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert [line for line in out.stderr.splitlines() if _lib.NOT_BUILT in line], out.stderr
