"""Hugging Face `generate` on a shape of the benchmark, in the same run: LlamaForCausalLM with random
bf16 weights on the same GPU, greedy with a static cache, where torch and transformers import."""

from __future__ import annotations

import statistics
import time
from typing import Callable

from arcpy.bench import kernels as kernel_bench
from arcpy.errors import InvalidArgumentError
from arcpy.model import SHAPES, ModelConfig


def hf_available() -> tuple[bool, str]:
    """(True, versions) when torch and transformers import and torch sees a GPU, else (False, why)."""
    try:
        import torch
        import transformers
    except Exception as exc:  # a broken install raises more than ImportError
        return False, f"{type(exc).__name__}: {exc}"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device"
    return True, f"torch {torch.__version__}, transformers {transformers.__version__}"


def hf_config_kwargs(cfg: ModelConfig) -> dict:
    """LlamaConfig arguments of the same shape. RoPE base and scaling keep their defaults: they
    change the angles, not the work. No end-of-sequence id, so a generation runs its full length."""
    return {"vocab_size": cfg.vocab, "hidden_size": cfg.dim, "intermediate_size": cfg.ffn_dim,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_seq, "rms_norm_eps": cfg.rms_eps,
            "tie_word_embeddings": cfg.tied_embeddings, "attention_bias": cfg.qkv_bias,
            "bos_token_id": 1, "eos_token_id": None, "pad_token_id": 0}


def steady_us_per_token(t_n: list[float], t_1: list[float], n: int) -> tuple[float, list[float]]:
    """Steady-state µs per token from paired wall times (s) of generate(n new) and generate(1 new):
    their difference is n - 1 decode steps; prefill and set-up cancel. Returns (median, per pair)."""
    if n < 2 or not t_n or len(t_n) != len(t_1):
        raise InvalidArgumentError(f"need n >= 2 and as many generate(n) as generate(1) times; got n={n}, "
                                   f"{len(t_n)} and {len(t_1)} times")
    per_pair = [(a - b) / (n - 1) * 1e6 for a, b in zip(t_n, t_1)]
    return statistics.median(per_pair), per_pair


def time_hf_generate(generate: Callable[[int], None], n: int, runs: int,
                     clock: Callable[[], float] = time.perf_counter) -> tuple[float, list[float], float]:
    """Time `generate(k)`, a complete generation of k new tokens that returns once the GPU is
    done: one warm-up of each length, then `runs` pairs. Returns (median µs/token, per pair,
    seconds of the warm-up, which holds any compilation)."""
    t0 = clock()
    generate(n)
    generate(1)
    warm = clock() - t0
    t_n, t_1 = [], []
    for _ in range(runs):
        t0 = clock()
        generate(1)
        t_1.append(clock() - t0)
        t0 = clock()
        generate(n)
        t_n.append(clock() - t0)
    med, per_pair = steady_us_per_token(t_n, t_1, n)
    return med, per_pair, warm


def bench_hf(cfg: ModelConfig, prompt: list[int], n: int, runs: int, compile: bool) -> dict:
    """LlamaForCausalLM of cfg's shape with random bf16 weights on the GPU: greedy `generate`
    with a static cache. transformers compiles a static-cache generate by itself unless told not
    to: `compile` decides."""
    import torch
    import transformers

    t0 = time.perf_counter()
    torch.manual_seed(0)
    hcfg = transformers.LlamaConfig(**hf_config_kwargs(cfg))
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # made in bf16 on the GPU: no float32 copy of 8B weights
    try:
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(hcfg)
    finally:
        torch.set_default_dtype(default)
    try:
        model = model.to(dtype=torch.bfloat16).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:  # matrices random; the norms stay ones
                    p.normal_(0.0, kernel_bench.WEIGHT_STD)
        ids = torch.tensor([prompt], device="cuda")
        mask = torch.ones_like(ids)
        torch.cuda.synchronize()
        setup = time.perf_counter() - t0

        def generate(k: int) -> None:
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=k, do_sample=False,
                                     cache_implementation="static", disable_compile=not compile,
                                     pad_token_id=0, eos_token_id=None)
            torch.cuda.synchronize()
            made = out.shape[1] - ids.shape[1]
            if made != k:
                raise RuntimeError(f"generate made {made} new tokens, asked for {k}")

        med, per_pair, warm = time_hf_generate(generate, n, runs)
        return {"us_per_token": med, "runs_us": [round(u, 2) for u in per_pair], "tokens": n, "runs": runs,
                "compile": compile, "cache": "static",
                "attn_implementation": str(getattr(model.config, "_attn_implementation", None)),
                "setup_s": round(setup, 1), "warmup_s": round(warm, 1)}
    finally:
        del model
        torch.cuda.empty_cache()


def hf_report(shapes: list[str], prompt: list[int], n: int, runs: int, compile: bool,
              progress: Callable[[str], None] | None = None) -> dict:
    """bench_hf for each shape; a failure is recorded in its row, never raised."""
    ok, versions = hf_available()
    out = {"available": ok, "versions": versions, "compile": compile, "shapes": {}}
    for shape in shapes if ok else []:
        t0 = time.perf_counter()
        try:
            row = bench_hf(SHAPES[shape], prompt, n, runs, compile)
        except Exception as exc:  # torch and transformers raise all kinds; the row says which
            row = {"error": (f"{type(exc).__name__}: {exc}".splitlines() or ["?"])[0]}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        out["shapes"][shape] = row
        if progress:
            progress(f"hf {shape}: {row}")
    return out
