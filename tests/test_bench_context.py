"""The long-context rows of the benchmark (arcpy.bench.context), on the CPU: the KV bytes a step
reads, with and without a window, and the checks and the text of the rows."""

import dataclasses

import pytest

from arcpy.bench.context import (check_context, context_max_seq, format_rows, kv_read_bytes, parse_contexts,
                                 without_window)
from arcpy.errors import InvalidArgumentError
from arcpy.model import SHAPES, random_model


def test_a_windowed_layer_reads_its_window_and_a_global_layer_everything():
    cfg = SHAPES["gemma3-4B"]
    assert (cfg.sliding_window, cfg.window_pattern) == (1024, 6)
    n_global = sum(1 for layer in range(cfg.n_layers) if layer % 6 == 5)
    per_position = 2 * cfg.n_kv_heads * cfg.head_dim * 2  # k and v, bf16
    assert kv_read_bytes(cfg, 4095) == per_position * (n_global * 4096 + (cfg.n_layers - n_global) * 1024)
    # Before the window fills, every layer reads every position.
    assert kv_read_bytes(cfg, 99) == per_position * cfg.n_layers * 100
    flat = dataclasses.replace(cfg, sliding_window=0, window_pattern=0)
    assert kv_read_bytes(flat, 4095) == per_position * cfg.n_layers * 4096


def test_the_window_is_taken_off_the_same_weights():
    model = random_model(dataclasses.replace(SHAPES["gemma3-tiny"], max_seq=64), seed=1, name="g")
    flat = without_window(model)
    assert model.config.sliding_window > 0 and flat.config.sliding_window == 0 and flat.config.window_pattern == 0
    assert flat.tensors.keys() == model.tensors.keys()
    assert all(flat.tensors[k] is model.tensors[k] for k in model.tensors)


def test_a_context_that_does_not_fit_is_one_clear_error():
    cfg = SHAPES["gemma3-4B"]
    check_context(cfg, 8192, 4096, 256)
    with pytest.raises(InvalidArgumentError, match="a context of 8000 tokens and 256 more do not fit"):
        check_context(cfg, 8192, 8000, 256)


def test_the_rows_print_the_windows_saving():
    rows = [{"context": 4096, "window": 1024, "window_pattern": 6, "us_per_token": 400.0,
             "kv_bytes_per_token": 100e6, "floor_us": 300.0, "host_waits_per_token": 0.0},
            {"context": 4096, "window": 0, "window_pattern": 0, "us_per_token": 430.0,
             "kv_bytes_per_token": 250e6, "floor_us": 330.0, "host_waits_per_token": 0.0}]
    lines = format_rows("gemma3-4B", rows)
    assert "window 1024 (every 6th layer global): 400.00 us/token (2500.0 tok/s), KV read 100.0 MB/token" in lines[0]
    assert "no window: 430.00 us/token" in lines[1]
    assert lines[2] == "gemma3-4B: the window saves 30.00 us/token and 150.0 MB of KV reads a token at a 4096-token context"


def test_the_contexts_are_a_list_of_prompt_lengths_or_one_clear_error():
    assert parse_contexts("0,4096,8192,32768") == [0, 4096, 8192, 32768]
    assert parse_contexts("4096") == [4096]
    for bad in ("", "4k", "1,-2", ","):
        with pytest.raises(InvalidArgumentError, match="expected prompt lengths like 0,4096"):
            parse_contexts(bad)
    # The cache holds the longest prompt and the tokens after it; a context of 0 is one token.
    assert context_max_seq([0, 4096, 32768], 128) == 32768 + 128
    assert context_max_seq([0], 128) == 129
    cfg = SHAPES["llama8B"]
    check_context(cfg, 129, 0, 128)
    with pytest.raises(InvalidArgumentError):
        check_context(cfg, 128, 0, 128)


def test_every_windowed_row_is_set_beside_its_unwindowed_one():
    def row(context, window, us, kv):
        return {"context": context, "window": window, "window_pattern": 6 if window else 0, "us_per_token": us,
                "kv_bytes_per_token": kv, "floor_us": 100.0, "host_waits_per_token": 0.0}
    rows = [row(4096, 1024, 400.0, 100e6), row(8192, 1024, 450.0, 120e6),
            row(4096, 0, 430.0, 250e6), row(8192, 0, 520.0, 480e6)]
    lines = format_rows("g", rows)
    assert lines[4] == "g: the window saves 30.00 us/token and 150.0 MB of KV reads a token at a 4096-token context"
    assert lines[5] == "g: the window saves 70.00 us/token and 360.0 MB of KV reads a token at a 8192-token context"
    assert len(lines) == 6


def test_the_attention_rows_print_a_line_per_position_in_order():
    from arcpy.bench.context import format_attention
    rows = [{"position": 8192, "us": 16.0, "runs_us": [16.0], "kv_bytes": 33.6e6, "GBps": 2100.0, "of_copy": 0.7},
            {"position": 1, "us": 5.0, "runs_us": [5.0], "kv_bytes": 8192.0, "GBps": 1.6, "of_copy": 0.001}]
    assert format_attention("llama8B-q4km", rows) == [
        "llama8B-q4km: one layer's attention, bf16 cache, @1 (0.0 MB of K and V): 5.00 us (2 GB/s, 0% of copy)",
        "llama8B-q4km: one layer's attention, bf16 cache, @8192 (33.6 MB of K and V): 16.00 us (2,100 GB/s, 70% of copy)"]
