"""CPU tier: the benchmark's pure logic. Table formatting against canned reports, the figures
computed from a config, the Hugging Face timing arithmetic against a fake generate and a fake
clock, the regression guard's arithmetic and its baseline file, and the script's options."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import arcpy
from arcpy.bench import guard
from arcpy.bench import hf as hf_bench
from arcpy.bench import kernels as kernel_bench
from arcpy.bench import loop as bench
from arcpy.devices.cuda_model import PREFILL_CHUNK
from arcpy.errors import ArcError, InvalidArgumentError
from arcpy.model import SHAPES, preset_formats, synthetic_model
from arcpy.sampling import Sampler, Sampling

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "docs" / "measurements" / "perf-baseline.json"


def load_script(name: str = "bench"):
    spec = importlib.util.spec_from_file_location(f"{name}_script", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- figures from the config ------------------------------------------------------------------

def test_device_memory_of_the_8b_shape_is_its_published_weights_plus_kv_and_activations():
    cfg = SHAPES["llama8B"]
    mem = bench.device_memory(cfg, 2048, scratch_bytes=1000)
    assert mem["weights"] == 2 * 8_030_261_248 + 4 * 64  # Llama-3-8B's parameter count, in bf16, + RoPE table
    assert mem["kv_cache"] == 2 * 32 * 8 * 2048 * 128 * 2  # k and v, every layer, bf16
    assert mem["activations"] == 4 * (4096 + 6144 + 4096 + 14336 + 128256) + 1000
    assert mem["total"] == mem["weights"] + mem["kv_cache"] + mem["activations"]


def test_generation_positions_run_from_the_prompts_last_to_before_max_seq():
    assert bench.generation_positions(4, 256, 2048) == (3, 258)
    assert bench.generation_positions(4, 5000, 1024) == (3, 1022)  # the engine stops short of max_seq
    assert bench.generation_positions(4, 2, 2048) == (3, 4)


def test_attention_positions_keep_mean_first_drop_repeats_and_positions_past_the_cache():
    assert kernel_bench.attention_positions(130, 258, 1024) == [130, 258, 512]
    assert kernel_bench.attention_positions(130, 258, 300) == [130, 258]
    assert kernel_bench.attention_positions(512, 512, 1024) == [512]


@pytest.mark.parametrize("shape", ["stories15M", "smollm2-135M", "llama8B", "qwen-tiny"])
def test_kernel_specs_read_every_weight_of_the_step_once(shape):
    cfg = SHAPES[shape]
    specs = kernel_bench.kernel_specs(cfg, [100, 200])
    gemvs = [s for s in specs if s.kind in ("qkv", "o", "gate_up", "down", "lm_head")]
    # weight_bytes counts an untied embedding as the one row the step reads; no GEMV reads it.
    embedding_row = 0 if cfg.tied_embeddings else 2 * cfg.dim
    assert sum(s.per_step * s.read_bytes for s in gemvs) == cfg.weight_bytes - embedding_row


@pytest.mark.parametrize("shape", ["tiny-quant", "tiny-quant-tied"])
def test_kernel_specs_of_a_quantized_preset_read_its_rows_once(shape):
    model = synthetic_model(shape)
    cfg = model.config
    specs = kernel_bench.kernel_specs(cfg, [100], preset_formats(shape))
    gemvs = {s.kind: s for s in specs if s.kind in ("qkv", "o", "gate_up", "down", "lm_head")}
    embedding_row = 0 if cfg.tied_embeddings else 2 * cfg.dim
    assert sum(s.replay_bytes for s in gemvs.values()) == model.weight_bytes - embedding_row
    # Layers differ in format: one launch reads their mean.
    assert gemvs["qkv"].read_bytes == round(gemvs["qkv"].replay_bytes / cfg.n_layers)
    assert gemvs["qkv"].name == "qkv gemv (norm) [Q4_K/Q6_K/Q8_0]"
    assert gemvs["o"].name == "o gemv (accumulate) [Q4_0]"  # layer 1's is bf16
    assert gemvs["lm_head"].name.endswith("[Q6_K]") is not cfg.tied_embeddings


def test_the_8b_q4_k_m_floor_counts_its_rows():
    cfg, formats = SHAPES["llama8B-q4km"], preset_formats("llama8B-q4km")
    specs = kernel_bench.kernel_specs(cfg, [100], formats)
    read = sum(s.replay_bytes for s in specs if s.kind in ("qkv", "o", "gate_up", "down", "lm_head"))
    step = read + 2 * cfg.dim  # and a bf16 embedding row
    assert step == 4_616_871_936 and cfg.weight_bytes / step == pytest.approx(3.251, abs=1e-3)  # bf16's floor / 3.25
    assert bench.quantized_preset("llama8B-q4km") and not bench.quantized_preset("llama8B")
    assert bench.format_counts(formats) == {"Q4_K": 192, "Q6_K": 33}
    mem = bench.device_memory(cfg, 2048, stored_bytes=10**9)
    assert mem["weights"] == 10**9 + 4 * 64


def test_kernel_specs_count_the_forwards_launches_and_one_attention_position():
    cfg = SHAPES["stories110M"]
    specs = kernel_bench.kernel_specs(cfg, [130, 258, 512])
    counted = [s for s in specs if s.in_step_sum]
    # 5 per layer, the embedding, and the lm_head with the argmax in it
    assert sum(s.per_step for s in counted) == 5 * cfg.n_layers + 2
    assert [s.kind for s in counted][-1] == "lm_head"
    attn = [s for s in specs if s.kind == "attention"]
    assert [(s.position, s.in_step_sum) for s in attn] == [(130, True), (258, False), (512, False)]
    # k and v of 12 heads x 64 over positions 0..130, bf16
    assert attn[0].read_bytes == 2 * 12 * 131 * 64 * 2


def test_step_sum_weights_each_counted_kernel_by_its_launches_per_step():
    rows = [{"per_step": 1, "us": 2.0, "in_step_sum": True},
            {"per_step": 6, "us": 3.0, "in_step_sum": True},
            {"per_step": 6, "us": 100.0, "in_step_sum": False}]
    assert kernel_bench.step_sum_us(rows) == pytest.approx(20.0)


def test_launches_per_replay_aims_at_the_target_within_bounds():
    assert kernel_bench.launches_per_replay(0.02, 0.001) == 20
    assert kernel_bench.launches_per_replay(0.02, 0.5) == 1
    assert kernel_bench.launches_per_replay(0.02, 1e-9, cap=4000) == 4000
    assert kernel_bench.launches_per_replay(0.02, 0.0, cap=77) == 77


# --- Hugging Face timing ------------------------------------------------------------------------

class FakeGenerate:
    """generate(k) on a fake clock: set-up + prefill, then `step` seconds per token after the first."""

    def __init__(self, setup: float, step: float, jitter=()):
        self.now, self.setup, self.step, self.calls = 0.0, setup, step, []
        self.jitter = list(jitter)

    def clock(self) -> float:
        return self.now

    def __call__(self, k: int) -> None:
        self.calls.append(k)
        self.now += self.setup + (k - 1) * self.step + (self.jitter.pop(0) if self.jitter else 0.0)


def test_hf_timing_cancels_prefill_and_reports_the_per_token_step():
    fake = FakeGenerate(setup=0.25, step=0.004)
    med, per_pair, warm = hf_bench.time_hf_generate(fake, 64, 3, clock=fake.clock)
    assert med == pytest.approx(4000.0)
    assert per_pair == pytest.approx([4000.0] * 3)
    assert warm == pytest.approx(2 * 0.25 + 63 * 0.004)
    assert fake.calls == [64, 1, 1, 64, 1, 64, 1, 64]  # a warm-up of each length first


def test_hf_timing_takes_the_median_pair():
    # the n-token generate of the second pair runs 63 ms slow: its pair reads 1 ms/token more
    fake = FakeGenerate(setup=0.1, step=0.002, jitter=[0, 0, 0, 0, 0, 0.063, 0, 0])
    med, per_pair, _ = hf_bench.time_hf_generate(fake, 64, 3, clock=fake.clock)
    assert per_pair == pytest.approx([2000.0, 3000.0, 2000.0])
    assert med == pytest.approx(2000.0)


@pytest.mark.parametrize("t_n,t_1,n", [([1.0], [0.5], 1), ([], [], 8), ([1.0, 2.0], [0.5], 8)])
def test_steady_state_refuses_what_it_cannot_compute(t_n, t_1, n):
    with pytest.raises(InvalidArgumentError):
        hf_bench.steady_us_per_token(t_n, t_1, n)


def test_hf_config_has_the_shape_and_no_end_of_sequence():
    kw = hf_bench.hf_config_kwargs(SHAPES["smollm2-135M"])
    assert (kw["hidden_size"], kw["num_hidden_layers"], kw["num_attention_heads"], kw["num_key_value_heads"],
            kw["head_dim"], kw["intermediate_size"], kw["vocab_size"]) == (576, 30, 9, 3, 64, 1536, 49152)
    assert kw["tie_word_embeddings"] is True and kw["eos_token_id"] is None
    assert hf_bench.hf_config_kwargs(SHAPES["llama8B"])["tie_word_embeddings"] is False


# --- tables -----------------------------------------------------------------------------------

def test_the_recorded_h200_report_still_formats():
    report = json.loads((ROOT / "docs" / "measurements" / "bench-h200-2026-11-30.json").read_text())
    text = bench.format_table(report)
    row = next(line for line in text.splitlines() if line.startswith("stories15M") and line.split()[3] == "16")
    # 100.63 us/token is 9,937 tok/s; the floor 7.16 us is 7.1% of it; a report without the
    # sampling column shows its rows as greedy
    assert row.split()[2:8] == ["greedy", "16", "100.63", "9937", "7.16", "7.1%"]
    assert "hf generate" in text and "per-kernel, llama8B" in text


def canned_report(hf: dict | None) -> dict:
    path = {"path": "device-loop", "burst": 16, "us_per_token": 200.0, "runs_us": [200.0],
            "graph_launches_per_token": 1.01, "cuda_calls_per_token": 1.1, "host_waits_per_token": 0.0}
    timings = [
        {"name": "qkv gemv (norm)", "per_step": 2, "us": 10.0, "runs_us": [10.0], "read_bytes": 20_000_000,
         "replay_bytes": 40_000_000, "in_step_sum": True, "position": None},
        {"name": "attention @130", "per_step": 2, "us": 5.0, "runs_us": [5.0], "read_bytes": 0,
         "replay_bytes": 0, "in_step_sum": True, "position": 130},
        {"name": "attention @512", "per_step": 2, "us": 9.0, "runs_us": [9.0], "read_bytes": 0,
         "replay_bytes": 0, "in_step_sum": False, "position": 512},
    ]
    shape = {"shape": "tiny", "weight_bytes": 10**8, "floor_us": 50.0, "paths": [path], "step_graph_nodes": 15,
             "memory_from_config": {"max_seq": 2048, "weights": 10**8, "kv_cache": 2 * 10**7,
                                    "activations": 3 * 10**6, "total": 123_000_000},
             "kernels": {"graph_launches": 2, "replays": 5, "positions": [130, 512], "timings": timings,
                         "sum_us": 30.0, "step_us": 200.0}}
    report = {"device": "NVIDIA H200", "date": "2026-12-01 10:00:00 UTC", "copy_bandwidth_GBps": 4000.0,
              "tokens": 256, "runs": 5, "shapes": [shape]}
    if hf is not None:
        report["hf"] = hf
    return report


def test_the_table_shows_hf_memory_graph_and_kernels():
    hf = {"available": True, "versions": "torch 2.11, transformers 5.0", "compile": False,
          "shapes": {"tiny": {"us_per_token": 1000.0, "runs_us": [1000.0], "tokens": 64, "runs": 3,
                              "compile": False, "cache": "static", "attn_implementation": "sdpa",
                              "setup_s": 1.0, "warmup_s": 2.5}}}
    text = bench.format_table(canned_report(hf))
    lines = text.splitlines()
    hf_row = next(line for line in lines if line.startswith("tiny") and "hf generate" in line)
    assert hf_row.split()[4:8] == ["1000.00", "1000", "50.00", "5.0%"]
    assert "torch.compile off" in text and "(t(generate 64 new) - t(generate 1 new)) / 63" in text
    assert "weights 0.100 GB + KV cache 0.020 GB + activations 3.00 MB = 0.123 GB" in text
    assert "15 nodes" in text
    qkv = next(line for line in lines if line.strip().startswith("qkv gemv"))
    # 20 MB in 10 us is 2,000 GB/s, half the copy bandwidth; 2 launches per step, 20 us
    assert qkv.split()[-6:] == ["10.00", "20.0", "20.00", "2000", "50.0%", "40.0"]
    assert any(line.strip().startswith("attention @512 *") for line in lines)
    assert "sum of kernels per step: 30.0 us" in text and "200.0 us, kernels alone = 15% of it" in text
    assert "matrix tensors" not in text  # a bf16 shape, or a report from before quantized presets


def test_the_table_names_a_quantized_presets_formats():
    report = canned_report(None)
    report["shapes"][0].update(formats={"Q4_K": 192, "Q6_K": 33}, weight_bytes=4_616_871_936)
    assert "tiny: matrix tensors 192 Q4_K, 33 Q6_K; 4.617 GB of weights read per token" in bench.format_table(report)


def test_the_table_says_how_many_experts_a_mixture_reads():
    report = canned_report(None)
    report["shapes"][0].update(weight_bytes=1_897_945_088,
                               experts={"n_experts": 128, "used": 8, "all_weight_bytes": 17_600_000_000, "moe_layers": 48})
    text = bench.format_table(report)
    assert ("tiny: a mixture of experts, 8 of 128 experts a token in 48 layers: 1.898 GB read a token of 17.600 GB"
            in text)
    assert "mixture" not in bench.format_table(canned_report(None))



def test_the_table_says_why_hf_is_missing_or_failed():
    text = bench.format_table(canned_report({"available": False, "versions": "ModuleNotFoundError: no torch",
                                             "compile": False, "shapes": {}}))
    assert "hf generate: not run (ModuleNotFoundError: no torch)" in text
    failed = {"available": True, "versions": "torch 2.11", "compile": False,
              "shapes": {"tiny": {"error": "RuntimeError: out of memory", "seconds": 1.0}}}
    assert "hf generate  " in bench.format_table(canned_report(failed))
    assert "FAILED: RuntimeError: out of memory" in bench.format_table(canned_report(failed))


def test_a_hybrids_deltanet_step_is_held_to_the_copy_bandwidth():
    report = canned_report(None)
    del report["shapes"][0]["kernels"]
    report["shapes"][0]["deltanet"] = {"layers": 48, "state_bytes": 6_000_000, "us": 3.0, "runs_us": [3.0]}
    # 6 MB read and written in 3 us: 2,000 GB/s, half the copy bandwidth of 4,000
    assert ("deltanet step alone, tiny: 3.00 us a launch x 48 layers, state 6.00 MB read and written a launch: "
            "2000 GB/s, 50.0% of copy bandwidth") in bench.format_table(report)
    report["shapes"][0]["deltanet"] = {"error": "invalid argument: dn_head_dim"}
    assert "deltanet step, tiny: FAILED: invalid argument: dn_head_dim" in bench.format_table(report)


def test_a_failed_kernel_bench_is_one_line():
    report = canned_report(None)
    report["shapes"][0]["kernels"] = {"error": "invalid argument: config.dim"}
    assert "per-kernel, tiny: FAILED: invalid argument: config.dim" in bench.format_table(report)


# --- the regression guard ---------------------------------------------------------------------

def test_the_baseline_file_parses_with_the_recorded_h200_figures():
    # The H200 figures are the device loop's at burst 16 in the recorded report of the same run.
    baseline = guard.read_baseline(BASELINE)
    report = json.loads((ROOT / "docs" / "measurements" / "bench-h200-2026-11-30-1603.json").read_text())
    recorded = {s["shape"]: round(1e6 / bench.greedy_loop16(s["paths"])[0]) for s in report["shapes"]
                if s["shape"] in SHAPES}
    assert baseline["NVIDIA H200"] == recorded
    assert all(shape in SHAPES for card in baseline.values() for shape in card)


def test_the_baseline_file_holds_the_h100_figures_of_its_recording_run():
    # Written by `scripts/bench.py --record-baseline` from this report's run on an H100.
    report = json.loads((ROOT / "docs" / "measurements" / "bench-h100-2026-12-06-2230-guard.json").read_text())
    recorded = {s["shape"]: round(1e6 / bench.greedy_loop16(s["paths"])[0]) for s in report["shapes"]
                if s["shape"] in SHAPES}
    assert report["device"] == "NVIDIA H100 80GB HBM3"
    assert guard.read_baseline(BASELINE)[report["device"]] == recorded


def test_the_guard_allows_15_percent_below_the_record_and_no_more():
    ok, lowest = guard.guard_verdict(890.8, 1048)
    assert lowest == pytest.approx(890.8) and ok
    assert not guard.guard_verdict(890.7, 1048)[0]
    assert guard.guard_verdict(2000, 1048)[0]
    assert not guard.guard_verdict(94, 100, tolerance=0.05)[0]


@pytest.mark.parametrize("text", ["{", "[]", '{"card": [1]}', '{"card": {"s": -1}}', '{"card": {"s": true}}',
                                  '{"card": {"s": "fast"}}'])
def test_a_malformed_baseline_is_one_clear_error(tmp_path, text):
    path = tmp_path / "baseline.json"
    path.write_text(text)
    with pytest.raises(InvalidArgumentError, match="baseline|expected"):
        guard.read_baseline(path)


def test_a_missing_baseline_is_one_clear_error(tmp_path):
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        guard.read_baseline(tmp_path / "none.json")


def test_a_card_s_figures_are_recorded_beside_the_other_cards(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"NVIDIA H200": {"llama1B": 1238, "llama8B": 243}}))
    report = canned_report(None)
    report["device"] = "NVIDIA H100 80GB HBM3"
    report["shapes"][0]["shape"] = "llama1B"  # its greedy device loop at burst 16: 200 us/token
    sampled = {**report["shapes"][0]["paths"][0], "sampling": "t0.8", "us_per_token": 100.0}
    burst4 = {**report["shapes"][0]["paths"][0], "burst": 4, "us_per_token": 150.0}
    report["shapes"][0]["paths"] += [sampled, burst4]
    report["shapes"].append({"shape": "scripted", "paths": [{**burst4, "burst": 16}]})  # not a benchmark shape
    written = guard.record_baseline(report, path)
    assert written == guard.read_baseline(path) == {"NVIDIA H200": {"llama1B": 1238, "llama8B": 243},
                                                    "NVIDIA H100 80GB HBM3": {"llama1B": 5000}}
    # Recording the same card again replaces its shapes' figures and keeps the ones not rerun.
    report["shapes"][0]["paths"][0]["us_per_token"] = 250.0
    report["device"] = "NVIDIA H200"
    assert guard.record_baseline(report, path)["NVIDIA H200"] == {"llama1B": 4000, "llama8B": 243}


def test_a_report_without_a_device_loop_figure_records_nothing(tmp_path):
    path = tmp_path / "baseline.json"
    report = canned_report(None)
    report["shapes"] = []
    with pytest.raises(InvalidArgumentError, match="no device-loop figure"):
        guard.record_baseline(report, path)
    assert not path.exists()


# --- the script -------------------------------------------------------------------------------

def test_the_script_defaults_to_every_benchmark_shape_kernels_and_hf_where_importable():
    script = load_script()
    args = script.parse_args([])
    assert args.shapes.split(",") == ["stories15M", "stories110M", "smollm2-135M", "llama1B", "llama8B"]
    assert all(s in SHAPES for s in args.shapes.split(","))
    assert args.kernels is True and args.hf is None and args.hf_compile is False
    trimmed = script.parse_args(["--shapes", "llama1B", "--tokens", "32", "--runs", "2", "--no-hf", "--no-kernels"])
    assert (trimmed.tokens, trimmed.runs, trimmed.hf, trimmed.kernels) == (32, 2, False, False)


@pytest.mark.parametrize("argv", [["--tokens", "1"], ["--runs", "0"], ["--hf-tokens", "1"]])
def test_the_script_refuses_counts_it_cannot_time(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        load_script().parse_args(argv)
    assert exc.value.code == 2


@pytest.mark.parametrize("argv", [["--runs", "0"], ["--tokens", "1"], ["--kernels", "130,x"], ["--kernels", "-1"],
                                  ["--bits", "0"]])
def test_the_ab_script_refuses_what_it_cannot_time(argv):
    with pytest.raises(SystemExit) as exc:
        load_script("ab_bench").main(argv)
    assert exc.value.code == 2


def test_the_ab_script_reads_positions_and_names_an_unknown_shape_in_one_line(capsys):
    script = load_script("ab_bench")
    assert script.positions("130,512") == [130, 512]
    assert script.main(["--shapes", "llama9000B", "--runs", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown synthetic shape 'llama9000B'" in err[0]


@pytest.mark.parametrize("script, args, message", [
    ("profile_step", ["--shapes", "tiny-quant,llama9000B"], "unknown synthetic shape 'llama9000B'"),
    ("sampled_divergence", ["--shapes", "stories15M,llama9000B"], "unknown synthetic shape 'llama9000B'"),
    ("profile_verify", ["--shape", "llama9000B"], "unknown synthetic shape 'llama9000B'"),
    ("profile_verify", ["--shape", "moe-tiny-quant"], "moe-tiny-quant is a mixture of experts"),
    ("profile_verify", ["--model", "/nonexistent/m.gguf"], "/nonexistent/m.gguf: no such GGUF file"),
    ("profile_verify", ["--shape", "stories15M", "--layers", "7"], "--layers must be in 1..6, got 7"),
])
def test_the_profile_scripts_refuse_bad_arguments_in_one_line_before_any_gpu_work(capsys, script, args, message):
    assert load_script(script).main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.skipif(arcpy.cuda_available(), reason="a GPU is present: the scripts would run")
@pytest.mark.parametrize("script, args", [
    ("profile_step", ["--shapes", "tiny-quant"]),
    ("sampled_divergence", ["--shapes", "stories15M"]),
    ("profile_verify", ["--shape", "stories15M", "--layers", "1"]),
])
def test_the_profile_scripts_say_in_one_line_that_there_is_no_gpu(capsys, script, args):
    assert load_script(script).main(args) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1 and err[0].startswith("error: ") and "CUDA" in err[0]


def test_the_boundary_distance_is_where_the_draw_lay_in_its_ids_interval():
    script = load_script("sampled_divergence")
    logits = np.random.default_rng(0).normal(size=5000).astype(np.float32)
    sampling = Sampling(temperature=0.7, seed=2)
    token = Sampler(sampling).sample(logits, 100)
    row = script.boundary_distance(logits, sampling, 100, token)
    assert row["kept_ids"] == 5000 and 0 < row["token_weight"] <= 2**40
    total = int(Sampler(sampling)._kept_weights(logits).astype(np.uint64).sum())
    assert 0 <= row["distance_over_mass"] <= row["token_weight"] / total / 2  # the nearer end of its interval
    with pytest.raises(ArcError, match="not the device's"):
        script.boundary_distance(logits, sampling, 100, (token + 1) % 5000)


@pytest.mark.gpu
def test_each_kernel_of_the_step_is_launched_once_in_the_tables_order():
    cfg, formats = SHAPES["tiny-quant"], preset_formats("tiny-quant")
    rows = load_script("profile_step").launch_each_once(cfg, 64, [7], formats)
    assert [r["name"] for r in rows] == [s.name for s in kernel_bench.kernel_specs(cfg, [7], formats)]
    launches = {r["kind"]: r["launches"] for r in rows}
    # Layer 0's q, k and v are in three formats (one GEMV each); every other kernel launches once
    # or more (attention may add a combine).
    assert launches["qkv"] == 3
    assert all(r["launches"] >= 1 for r in rows)


class LogitsDevice:
    """What logits_hash calls of a device: logits that depend on the token and the position."""

    def __init__(self, flip_at=None):
        self.inputs, self.flip_at = [], flip_at

    def set_input(self, token, pos):
        self.inputs.append((token, pos))

    def enqueue_forward(self):
        pass

    def enqueue_logits_to_host(self):
        pass

    def stream_query(self):
        return True

    @staticmethod
    def logits(token, pos):
        return np.sin(np.arange(64, dtype=np.float32) * (token + 1) + pos).astype(np.float32)

    def host_logits(self):
        token, pos = self.inputs[-1]
        logits = self.logits(token, pos)
        if pos == self.flip_at:
            logits[5] = np.nextafter(logits[5], np.float32(np.inf))  # one bit of one logit
        return logits


def test_the_ab_script_hashes_the_bits_of_greedy_forwards():
    script = load_script("ab_bench")
    a, b, flipped = LogitsDevice(), LogitsDevice(), LogitsDevice(flip_at=3)
    assert script.logits_hash(a, 6) == script.logits_hash(b, 6)
    assert script.logits_hash(flipped, 6) != script.logits_hash(LogitsDevice(), 6)
    # Each forward reads the argmax of the one before, from token 1 at position 0.
    tokens = [1] + [int(np.argmax(LogitsDevice.logits(t, p))) for t, p in a.inputs[:-1]]
    assert a.inputs == list(zip(tokens, range(6)))


def test_an_unknown_shape_is_refused_before_any_gpu_work():
    with pytest.raises(InvalidArgumentError, match="unknown shape"):
        bench.run(["stories15M", "llama9000B"])


def test_run_saves_the_report_after_each_part(monkeypatch):
    class FakeContext:
        def __init__(self, device):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def name(self):
            return "Fake GPU"

    monkeypatch.setattr(bench, "Context", FakeContext)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda ctx: 4e12)
    monkeypatch.setattr(bench, "bench_scripted", lambda tokens, runs: {"shape": "scripted"})
    monkeypatch.setattr(bench, "bench_shape", lambda s, bw, tokens, runs, kernels: {"shape": s, "seconds": {}})
    monkeypatch.setattr(hf_bench, "hf_report", lambda shapes, prompt, n, runs, compile, say: {"shapes": list(shapes)})
    seen = []
    report = bench.run(["stories15M", "llama1B"], 16, 2, hf=bench.HfRun(),
                       on_update=lambda r: seen.append([s["shape"] for s in r["shapes"]] + (["hf"] if "hf" in r else [])))
    assert seen == [["scripted"], ["scripted", "stories15M"], ["scripted", "stories15M", "llama1B"],
                    ["scripted", "stories15M", "llama1B", "hf"]]
    assert report["device"] == "Fake GPU" and report["copy_bandwidth_GBps"] == pytest.approx(4000.0)


def test_the_table_shows_time_to_first_token_and_the_prefill_gemms():
    report = canned_report(None)
    shape = report["shapes"][0]
    shape["ttft"] = [{"prompt_tokens": 128, "prefill": True, "ms": 1.25, "runs_ms": [1.25]},
                     {"prompt_tokens": 128, "prefill": False, "ms": 14.5, "runs_ms": [14.5]}]
    shape["prefill_gemms"] = [{"name": "qkv", "m": 512, "n": 3072, "k": 2048, "us": 20.0, "tflops": 322.1,
                               "runs_us": [20.0]}]
    text = bench.format_table(report)
    assert f"tiny: time to first token, 128-token prompt, one prefill (chunks of {PREFILL_CHUNK}): 1.25 ms" in text
    assert "tiny: time to first token, 128-token prompt, token by token: 14.50 ms" in text
    assert "m = 512 tokens: qkv 3072x2048 20.0 us 322 TFLOP/s" in text
    shape["prefill_gemms"] = {"error": "invalid argument: k % 8"}
    assert "tiny: prefill GEMMs: FAILED: invalid argument: k % 8" in bench.format_table(report)



def test_the_loop_rows_time_plain_steps_even_where_the_model_repeats_itself():
    """Speculation is on by default; the loop rows stay the plain step against the bandwidth floor."""
    from arcpy.bench.loop import bench_paths
    from arcpy.devices.fake import FakeDevice, FakeScript

    looping = FakeScript(next_token=lambda tok, pos: (tok * 5 + 1) % 17, speculate_k=4, latency=1, ops_per_tick=64)
    dev = FakeDevice(looping)
    before = dev.spec_steps
    rows = bench_paths(dev, tokens=48, runs=1, bursts=(16,))
    assert [r.path for r in rows][:2] == ["host", "device-loop"]
    assert dev.spec_steps == before  # no speculative step ran, though every draft would have matched
