"""What the serving features cost and save on the device loop: a conversation's turns with the
prefix cache against the same turns cold, and log-probabilities in the step against none.

Turns: a conversation of `turns` turns on random token ids, each turn's prompt the whole history
(a system prompt, every earlier question and the model's own answer) and a new question, sized so
that the last turn's history is about `history` tokens. It runs twice on one open device: on an
engine with the prefix cache (the turns in order, so each reuses what the one before left), and
on an engine without it. A row reports each turn's time to first token both ways (median of the
runs), the share of prompt tokens the cache supplied, and whether both gave the same answers
(greedy: they must).

Log-probabilities: the greedy device loop (burst 16) with `top` alternatives a token against
none, on the same prompt; the step then also runs libarc/logprobs.cu, whose entries go into the
ring beside the tokens.

Structured output (a model with a tokenizer: the demo model): sampled chat answers (temperature
0.7, several seeds) under a JSON schema against the same requests unconstrained: tokens a second
after the first, host waits a token, and whether every constrained answer that ended parses.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time

import numpy as np

from arcpy.bench.loop import PROMPT, bench_max_seq, time_generation
from arcpy.devices.cuda import open_cuda_device
from arcpy.errors import ArcError, InvalidArgumentError
from arcpy.loop.engine import Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.request import Constraint, Request
from arcpy.loop.settings import EngineSettings
from arcpy.loop.stats import FinishReason
from arcpy.model import SHAPES, preset_formats, random_model, synthetic_model
from arcpy.sampling import Sampling

ANSWER = 48     # new tokens of each turn's answer
QUESTION = 24   # tokens of each turn's question
BURST = 16


def conversation(vocab: int, turns: int, history: int, seed: int = 0) -> tuple[list[int], list[list[int]]]:
    """A system prompt and `turns` questions (random ids), the system prompt sized so that the
    last turn's history (with ANSWER tokens an earlier answer) is about `history` tokens."""
    rng = np.random.default_rng(seed)
    system = history - (turns - 1) * (QUESTION + ANSWER) - QUESTION
    if system < 1:
        raise InvalidArgumentError(f"a history of {history} tokens is too short for {turns} turns of "
                                   f"{QUESTION + ANSWER} tokens each")
    ids = lambda n: rng.integers(3, vocab, n).tolist()
    return ids(system), [ids(QUESTION) for _ in range(turns)]


def run_turns(engine: Engine, system: list[int], questions: list[list[int]], clear: bool) -> dict:
    """One conversation on `engine`: each turn's time to first token (ms), answer and cached
    prompt tokens. `clear`: the cache is emptied before every turn (the cold run)."""
    history, out = list(system), {"ms": [], "answers": [], "cached": 0, "prompt": 0}
    for q in questions:
        prompt = history + q
        if clear:
            engine.prefix.clear()
        t0 = time.perf_counter()
        gen = engine.generate(Request(prompt_ids=prompt, max_new_tokens=ANSWER))
        answer = [next(gen)]
        out["ms"].append((time.perf_counter() - t0) * 1e3)
        answer.extend(gen)
        out["answers"].append(answer)
        out["cached"] += engine.stats.cached_tokens
        out["prompt"] += engine.stats.prompt_tokens
        history = prompt + answer
    return out


def turns_row(device, turns: int, history: int, runs: int) -> dict:
    """The conversation with the prefix cache and cold, `runs` times each after a warm-up."""
    if history + ANSWER > device.max_seq:
        raise InvalidArgumentError(f"a history of {history} tokens and its answer do not fit the "
                                   f"device's {device.max_seq} positions")
    system, questions = conversation(device.vocab, turns, history)
    make = lambda cache: Engine(device, "cuda",
                                EngineSettings(device_loop=True, burst=BURST, speculate=False, prefix_cache=cache),
                                environ={}, latch=FallbackLatch())
    warm, cold = make(True), make(False)
    results = {"cached": [], "cold": []}
    for i in range(runs + 1):
        for name, eng in (("cached", warm), ("cold", cold)):
            if name == "cached":
                eng.prefix.clear()  # each run is a new conversation
            r = run_turns(eng, system, questions, clear=name == "cold")
            if eng.stats.path != "device-loop":
                raise ArcError(f"turns: asked for the device loop, the engine took {eng.stats.path}")
            if i > 0:  # the first run warms up
                results[name].append(r)
    med = lambda name, t: statistics.median(r["ms"][t] for r in results[name])
    last = results["cached"][-1]
    return {"turns": turns, "history_tokens": history, "answer_tokens": ANSWER, "runs": runs,
            "ttft_ms_cached": [round(med("cached", t), 3) for t in range(turns)],
            "ttft_ms_cold": [round(med("cold", t), 3) for t in range(turns)],
            "last_turn_prompt_tokens": len(system) + sum(map(len, questions)) + ANSWER * (turns - 1),
            "hit_rate": last["cached"] / last["prompt"],
            "same_answers": all(r["answers"] == results["cold"][0]["answers"]
                                for r in results["cached"] + results["cold"])}


def logprobs_row(device, tokens: int, runs: int, top: int = 5) -> dict:
    """Greedy device-loop µs a token with `top` log-probability alternatives and without."""
    eng = Engine(device, "cuda", EngineSettings(device_loop=True, burst=BURST, speculate=False), environ={},
                 latch=FallbackLatch())
    row = {"top_logprobs": top, "burst": BURST}
    for name, lp in (("plain", None), ("logprobs", top)):
        us, st = time_generation(eng, Request(prompt_ids=PROMPT, max_new_tokens=tokens, logprobs=lp), tokens, runs)
        if st.path != "device-loop":
            raise ArcError(f"log-probabilities: asked for the device loop, the engine took {st.path}")
        row[f"us_{name}"] = statistics.median(us)
        row[f"host_waits_per_token_{name}"] = st.per_token(st.host_waits)
    row["ratio"] = row["us_plain"] / row["us_logprobs"]
    return row


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "year", "tags"],
          "properties": {"name": {"type": "string"}, "year": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}}}
ASK = ({"role": "system", "content": "You answer with one JSON object."},
       {"role": "user", "content": "Describe a famous bridge: its name, the year it opened, and a few tags."})


def constrained_row(device, text, seeds: int = 8, tokens: int = 200) -> dict:
    """Sampled answers under SCHEMA and the same requests unconstrained, on the engine's default
    path for each: the device loop, where a constrained step waits on the device for the mask the
    host writes (libarc/mask.cu); the host path on a device without masks."""
    eng = Engine(device, "cuda", EngineSettings(burst=BURST, speculate=False), environ={}, latch=FallbackLatch())
    eng.text = text
    fmt = Constraint.of({"type": "json_schema", "json_schema": {"name": "bridge", "schema": SCHEMA, "strict": True}})
    row = {"seeds": seeds, "max_tokens": tokens}
    for name, constraint in (("free", None), ("schema", fmt)):
        rates, waits, parsed, ended = [], 0, 0, 0
        made = 0
        for seed in range(seeds + 1):
            req = Request(messages=ASK, max_new_tokens=tokens, response_format=constraint,
                          sampling=Sampling(temperature=0.7, seed=seed))
            stamps, text_out = [], []
            for piece in eng.stream(req):
                if piece.token is not None:
                    stamps.append(time.perf_counter())
                text_out.append(piece.text or "")
            if seed == 0 or len(stamps) < 2:  # the first request warms up
                continue
            rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
            waits += eng.stats.host_waits
            made += eng.stats.tokens
            if constraint is not None and eng.stats.finish_reason != FinishReason.TOKEN_BUDGET:
                ended += 1
                try:
                    json.loads("".join(text_out))
                    parsed += 1
                except ValueError:
                    pass
        row[f"tok_s_{name}"] = statistics.median(rates)
        row[f"host_waits_per_token_{name}"] = waits / max(made, 1)
        row[f"path_{name}"] = eng.stats.path
        if constraint is not None:
            row["ended"], row["parsed"] = ended, parsed
    row["ratio"] = row["tok_s_schema"] / row["tok_s_free"]
    return row


def synthetic_for(shape: str, history: int):
    """The synthetic model of `shape` (random weights) with room for a conversation of `history`
    tokens and its answer: the preset's context, or longer where the conversation needs it."""
    cfg = SHAPES.get(shape)  # an unknown shape is refused by synthetic_model, in one line
    return synthetic_model(shape, seed=0, max_seq=max(cfg.max_seq, history + ANSWER) if cfg else None)


def run(shapes: list[str], demo_path, turns: int, history: int, tokens: int, runs: int, progress) -> dict:
    """The turns and log-probabilities rows for each synthetic shape (random weights) and for the
    demo model where its file is given; with the demo model also the constrained row, on it and on
    each shape made with its vocabulary (a grammar needs the tokenizer): {name: {row: ...}}."""
    from arcpy.loading import load_gguf

    report, text = {}, None
    models = [(shape, lambda shape=shape: (synthetic_for(shape, history), None)) for shape in shapes]
    if demo_path is not None:
        demo_model, text = load_gguf(demo_path)
        models.insert(0, ("demo " + demo_path.stem, lambda: (demo_model, text)))
        for shape in shapes:
            cfg = dataclasses.replace(SHAPES[shape], vocab=text.tokenizer.get_vocab_size())
            models.append((f"{shape} with the demo's vocabulary",
                           lambda cfg=cfg, shape=shape: (random_model(cfg, formats=preset_formats(shape)), text)))
    for name, make in models:
        model, model_text = make()
        with open_cuda_device(model, max_seq=max(history + ANSWER, bench_max_seq(model.config))) as device:
            t0 = time.perf_counter()
            rows = report[name] = {}
            if not name.endswith("the demo's vocabulary"):
                rows["turns"] = turns_row(device, turns, history, runs)
                rows["logprobs"] = logprobs_row(device, tokens, runs)
            if model_text is not None:
                rows["constrained"] = constrained_row(device, model_text)
            progress(f"{name}: serving rows in {time.perf_counter() - t0:.1f}s")
        del model
    return report


def format_rows(shape: str, turns: dict | None, logprobs: dict | None, constrained: dict | None = None) -> list[str]:
    lines = []
    if turns:
        t = turns["turns"] - 1
        c, w = turns["ttft_ms_cold"][t], turns["ttft_ms_cached"][t]
        lines.append(f"{shape}: turn {turns['turns']} of a {turns['history_tokens']}-token conversation: time to "
                     f"first token {w:.2f} ms with the prefix cache, {c:.2f} ms cold ({w / c:.1%}); hit rate "
                     f"{turns['hit_rate']:.1%}; answers {'equal' if turns['same_answers'] else 'DIFFER'}")
    if logprobs:
        lines.append(f"{shape}: device loop with top_logprobs {logprobs['top_logprobs']}: "
                     f"{logprobs['us_logprobs']:.2f} us/token against {logprobs['us_plain']:.2f} without "
                     f"({logprobs['ratio']:.1%} of the speed); host waits/token "
                     f"{logprobs['host_waits_per_token_logprobs']:.2f}")
    if constrained:
        c = constrained
        lines.append(f"{shape}: sampled chat under a JSON schema: {c['tok_s_schema']:.0f} tok/s ({c['path_schema']}, "
                     f"host waits/token {c['host_waits_per_token_schema']:.2f}) against {c['tok_s_free']:.0f} "
                     f"unconstrained ({c['path_free']}): {c['ratio']:.1%}; {c['parsed']} of {c['ended']} ended "
                     f"answers parse")
    return lines
