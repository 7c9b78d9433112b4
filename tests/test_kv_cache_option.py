"""`--kv-cache FORM` (arcpy/options.py): the form the KV cache holds its rows in, from the command
line to the device. The NumPy backend holds every form (arcpy/devices/kv_formats.py); libarc bf16 and
q8_0 (its GPU tier: tests/test_gpu_kv_q8.py). A form a model or a backend cannot take is refused in
one line before anything opens; the memory check and the benchmark's floor count each form's bytes."""

import subprocess
import sys

import numpy as np
import pytest

from arcpy.backends import open_device, open_engine
from arcpy.bench.context import kv_read_bytes, parse_kv_caches
from arcpy.devices.cuda_model import check_fits, check_kv_cache
from arcpy.devices.kv_formats import kv_position_bytes
from arcpy.devices.reference import ReferenceModel
from arcpy.errors import InvalidArgumentError
from arcpy.model import synthetic_model

TINY = synthetic_model("qwen-tiny", seed=2)  # head_dim 32
STORIES = synthetic_model("stories15M", seed=0)  # head_dim 48


def reference_greedy(model, prompt, n, kv_cache):
    ref = ReferenceModel(model, kv_cache=kv_cache)
    logits = ref.prefill(prompt)
    out = []
    for pos in range(len(prompt), len(prompt) + n):
        out.append(int(np.argmax(logits)))
        logits = ref.forward(out[-1], pos)
    return out


def test_the_numpy_backend_decodes_with_the_form_asked_for():
    prompt = [5, 9, 2, 7, 1, 3, 3, 8]
    got = {}
    for form in ("bf16", "q8_0", "fp8"):
        with open_engine(TINY, "numpy", kv_cache=form, environ={}) as engine:
            got[form] = list(engine.generate(prompt, 12))
        assert got[form] == reference_greedy(TINY, prompt, 12, form), form


def test_the_command_line_takes_kv_cache_and_refuses_what_a_model_cannot_hold():
    def decode(*args):
        return subprocess.run([sys.executable, "-m", "arcpy.decode", *args], capture_output=True, text=True,
                              timeout=300)

    out = decode("--shape", "qwen-tiny", "--backend", "numpy", "--kv-cache", "q8_0", "--prompt-ids", "5 9 2", "-n", "4")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == 4
    out = decode("--shape", "stories15M", "--backend", "numpy", "--kv-cache", "q8_0", "-n", "2")
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert len(errors) == 1
    assert "a q8_0 KV cache holds whole blocks of 32 values; this model's heads have 48" in errors[0]
    out = decode("--shape", "qwen-tiny", "--kv-cache", "q4")
    assert out.returncode == 2 and "Invalid value for '--kv-cache'" in out.stderr


def test_forms_a_backend_cannot_hold_are_refused_in_one_line_before_anything_opens():
    with pytest.raises(InvalidArgumentError, match="must be one of bf16, q8_0, fp8, got 'q4'"):
        open_device(TINY, "numpy", kv_cache="q4")
    with pytest.raises(InvalidArgumentError, match="heads have 48: use --kv-cache bf16"):
        open_device(STORIES, "numpy", kv_cache="q8_0")
    with pytest.raises(InvalidArgumentError, match="a model split over ranks holds its KV cache in bf16, not q8_0"):
        open_device(TINY, "numpy", devices=[0, 1], kv_cache="q8_0")
    with pytest.raises(InvalidArgumentError, match="the CUDA backend holds its KV cache in bf16 or q8_0, not fp8"):
        check_kv_cache(TINY.config, "fp8")
    with pytest.raises(InvalidArgumentError, match="heads have 48"):
        check_kv_cache(STORIES.config, "q8_0")
    assert (check_kv_cache(TINY.config, "bf16"), check_kv_cache(TINY.config, "q8_0")) == (0, 1)  # arc_kv_form


def test_the_memory_check_counts_the_forms_bytes_and_the_prefills_bf16_layer():
    cfg = TINY.config
    q8 = kv_position_bytes("q8_0", cfg.kv_layers, cfg.n_kv_heads, cfg.head_dim)
    assert q8 == 2 * cfg.kv_layers * cfg.n_kv_heads * (cfg.head_dim + cfg.head_dim // 32 * 2)  # codes and scales
    per_position = q8 + kv_position_bytes("bf16", 1, cfg.n_kv_heads, cfg.head_dim)  # one layer widened to bf16
    check_fits(TINY, 256, TINY.stored_bytes + 256 * per_position, "q8_0")
    with pytest.raises(InvalidArgumentError, match="GB of q8_0 KV cache for 256 positions.*at most 255$"):
        check_fits(TINY, 256, TINY.stored_bytes + 256 * per_position - 1, "q8_0")


def test_the_benchmark_counts_each_forms_bytes_read():
    cfg = synthetic_model("gqa", seed=0).config
    assert kv_read_bytes(cfg, 1023, "q8_0") * 64 == kv_read_bytes(cfg, 1023) * 34
    assert parse_kv_caches("bf16, q8_0") == ("bf16", "q8_0")
    for bad in ("", "fp8", "bf16,q4"):
        with pytest.raises(InvalidArgumentError, match="expected forms among bf16, q8_0"):
            parse_kv_caches(bad)
