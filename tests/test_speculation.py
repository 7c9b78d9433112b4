"""Speculative steps, CPU tier: the drafts' definition and its incremental form, the estimate of
what speculation gains, the policy, and the loop's control logic against FakeDevice, whose
speculative step drafts, verifies and accepts as libarc's does (one model token a verify row)."""

import random

import numpy as np
import pytest
from scripted_tokens import following

from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.devices.sequence import SequenceStart
from arcpy.drafting import Acceptance, NgramIndex, draft
from arcpy.errors import FaultWordError, ShortBurstError
from arcpy.loop.burst import BurstDriver
from arcpy.loop.engine import DEVICE_LOOP, Engine
from arcpy.loop.settings import EngineSettings
from arcpy.loop.speculate import COST_PRIOR, PLAIN, SPECULATIVE, SpecPolicy, StepCost
from arcpy.loop.stats import STOP_ID, TOKEN_BUDGET
from arcpy.sampling import Sampling

PROMPT = [1, 2, 3]


def cycle_next(tok, pos):
    """A model whose output repeats: every token has one successor (a cycle of 17)."""
    return (tok * 5 + 1) % 17


def drift_next(tok, pos):
    """Repeats in stretches of 12 positions, then changes the rule: drafts match, then miss."""
    return (tok * 5 + 1 + pos // 12) % 17


def reference(n, rule, prompt=PROMPT):
    return following(rule, prompt[-1], len(prompt) - 1, n)


def engine(latch, rule=cycle_next, k=4, **kw):
    script = FakeScript(next_token=rule, speculate_k=k, **kw.pop("script", {}))
    # The fake's timing means nothing: the policy weighs steps by the prior cost alone.
    return Engine(FakeDevice(script), "fake", EngineSettings(device_loop=True, **kw), environ={}, latch=latch,
                  step_cost=StepCost(measure=False))


# --- the drafts ---------------------------------------------------------------------------------

def test_draft_proposes_what_followed_the_latest_longest_match():
    #          0  1  2  3  4  5  6  7  8  9
    history = [5, 6, 7, 8, 9, 6, 7, 1, 2, 7]
    # last 1-gram [7] ends at 2 and 6; no longer match ([2, 7] never occurred): latest j = 6
    assert draft(history, 3, 3) == [1, 2, 7]
    assert draft(history + [1], 4, 3) == [2, 7, 1, 2]  # [7, 1] occurred at 6..7: longer wins
    assert draft(history, 2, 3) == [1, 2]            # at most k
    assert draft([4, 4], 5, 2) == [4, 4, 4, 4, 4]    # a loop goes on looping
    assert draft([1, 5, 6, 1], 5, 3) == [5, 6, 1, 5, 6]  # with the period of the match
    assert draft([1, 2, 3], 4, 3) == []              # nothing repeats
    assert draft([3], 4, 3) == []


def test_the_longest_match_beats_a_later_shorter_one():
    history = [1, 2, 9, 5, 2, 8, 1, 2]
    # [1, 2] ends at 1 (then 9); [2] alone ends later at 4 (then 8): the longer match wins
    assert draft(history, 1, 3) == [9]
    assert draft(history, 1, 1) == [8]  # with 1-grams only, the latest


@pytest.mark.parametrize("seed", range(6))
def test_the_incremental_index_drafts_exactly_as_the_definition(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([3, 5, 40])
    ngram, k = rng.choice([1, 2, 3, 8]), rng.choice([1, 4, 7])
    index = NgramIndex(ngram)
    history = []
    for _ in range(300):
        tok = rng.randrange(alphabet)
        history.append(tok)
        index.append(tok)
        assert index.draft(k) == draft(history, k, ngram)


def test_acceptance_counts_what_each_step_would_make():
    est = Acceptance(k=3, ngram=2, prompt=[1, 2, 3, 1], weight=1.0)  # weight 1: the last step
    assert est._draft == [2, 3, 1]
    for tok in (2, 3, 1):
        est.push(tok)
        assert est.steps == 0  # still inside the step: each draft matched
    est.push(2)  # the model's own token after three accepted drafts: a step of 4
    assert (est.steps, est.tokens_per_step) == (1, 4.0)
    est.push(9)  # the next step's draft was [3, 1, 2]: missed at once, a step of 1
    assert (est.steps, est.tokens_per_step) == (2, 1.0)


# --- the policy ---------------------------------------------------------------------------------

def test_step_cost_uses_the_prior_until_both_kinds_are_measured():
    cost = StepCost(weight=1.0)
    assert cost.ratio() == COST_PRIOR
    cost.record(PLAIN, 4, 0.004)
    assert cost.ratio() == COST_PRIOR
    cost.record(SPECULATIVE, 2, 0.0025)
    assert cost.ratio() == pytest.approx(1.25)
    cost.record(PLAIN, 0, 1.0)  # no steps: ignored
    assert cost.ratio() == pytest.approx(1.25)
    fixed = StepCost(measure=False)
    fixed.record(PLAIN, 4, 0.004)
    fixed.record(SPECULATIVE, 4, 0.1)
    assert fixed.ratio() == COST_PRIOR


def test_policy_starts_plain_speculates_once_drafts_would_pay_and_sizes_bursts_by_them():
    cost = StepCost(measure=False)
    policy = SpecPolicy(4, 3, [0, 1, 2, 3], cost)
    assert not policy.speculate()  # one token a step until the tokens show otherwise
    for tok in [0, 1, 2, 3] * 3:  # the prompt again: every draft matches
        policy.push(tok)
    assert policy.speculate()
    tps = policy.acceptance.tokens_per_step
    assert tps > 2.0
    assert policy.steps(burst=16, remaining=10) == max(1, int(10 // tps))  # never past the budget
    assert policy.steps(burst=2, remaining=100) == 2
    assert policy.steps(burst=16, remaining=1) == 1
    for tok in range(7, 27):  # nothing repeats: steps of 1 token
        policy.push(tok)
    assert not policy.speculate()


def test_policy_weighs_the_measured_cost_of_a_speculative_step():
    cost = StepCost(weight=1.0)
    policy = SpecPolicy(4, 3, [5, 6, 7, 8], cost)
    for tok in [5, 6, 7, 8] * 2:
        policy.push(tok)
    assert not policy.speculate()  # no plain step timed yet: the ratio would be a guess
    cost.record(PLAIN, 16, 0.016)
    assert policy.speculate()
    cost.record(SPECULATIVE, 16, 0.016 * (policy.acceptance.tokens_per_step + 1))  # dearer than it gains
    assert not policy.speculate()


# --- the driver and the engine on FakeDevice ------------------------------------------------------

def driver_for(rule=cycle_next, stop_ids=(), k=4, **kw):
    dev = FakeDevice(FakeScript(next_token=rule, speculate_k=k, **kw))
    drv = BurstDriver(dev, max_spins=10_000, query_every=16)
    drv.begin_sequence(SequenceStart(loop=True, stop_ids=tuple(stop_ids)))
    dev.enqueue_prefill(PROMPT, 0)
    dev.set_input(PROMPT[-1], len(PROMPT) - 1)
    return dev, drv


def test_speculative_burst_yields_the_models_tokens_and_more_than_one_a_step():
    dev, drv = driver_for()
    got = list(drv.run_speculative(steps=24, max_tokens=200))
    assert got == reference(len(got), cycle_next)
    assert dev.spec_steps == drv.steps == 24
    assert len(got) > 24 + 20  # once the cycle repeats, drafts are accepted
    assert all(len(d) <= 4 for d in dev.drafts)


def test_the_burst_limit_stops_publication_mid_step():
    dev, drv = driver_for()
    list(drv.run_speculative(steps=20, max_tokens=200))  # learn the cycle
    base = drv.published
    got = list(drv.run_speculative(steps=3, max_tokens=5))
    while not dev.stream_query():  # let the burst's last steps retire: they publish nothing
        pass
    assert len(got) == 5 and len(dev.ring) == drv.published == base + 5
    assert dev.ring[-5:] == got


def test_a_stop_id_inside_an_accepted_run_ends_the_sequence_there():
    want = reference(60, cycle_next)
    stop = want[30]
    dev, drv = driver_for(stop_ids=(stop,))
    got = []
    for _ in range(20):
        got += drv.run_speculative(steps=4, max_tokens=100)
        if got and got[-1] == stop:
            break
    assert got == want[:want.index(stop) + 1]
    assert dev.ring == got  # nothing after the stop id was published


def test_a_lost_speculative_step_is_idle_but_short():
    dev, drv = driver_for(lost_steps=frozenset({2}))
    with pytest.raises(ShortBurstError, match="speculative steps ran"):
        list(drv.run_speculative(steps=4, max_tokens=100))


def test_a_latched_fault_word_in_a_speculative_step_raises_after_the_tokens_before_it():
    dev, drv = driver_for(fault_word_at=3)
    got = []
    with pytest.raises(FaultWordError):
        for tok in drv.run_speculative(steps=6, max_tokens=100):
            got.append(tok)
    assert got == dev.ring and got == reference(len(got), cycle_next)


@pytest.mark.parametrize("rule", [cycle_next, drift_next])
@pytest.mark.parametrize("burst", [1, 4, 16])
@pytest.mark.parametrize("prefill", [True, False])
def test_engine_tokens_are_those_of_the_plain_loop(latch, rule, burst, prefill):
    spec = engine(latch, rule, burst=burst, prefill=prefill)
    plain = engine(latch, rule, k=0, burst=burst, prefill=prefill)
    got = list(spec.generate(PROMPT, 97))
    assert got == list(plain.generate(PROMPT, 97)) == reference(97, rule)
    st = spec.stats
    assert st.path == DEVICE_LOOP and st.finish_reason == TOKEN_BUDGET and st.tokens == 97
    assert st.speculation == "on" and plain.stats.speculation == "off"
    if rule is cycle_next and burst > 1:
        assert st.tokens_per_step > 2 and st.tokens_per_weight_read > 2
        assert 0 < st.acceptance <= 1


def test_engine_stops_at_a_stop_id_drafted_inside_a_run(latch):
    want = reference(80, cycle_next)
    stop = want[40]
    eng = engine(latch, burst=8)
    got = list(eng.generate(PROMPT, 80, stop_ids=[stop]))
    assert got == want[:want.index(stop)]
    assert eng.stats.finish_reason == STOP_ID and eng.stats.stop_id == stop


@pytest.mark.parametrize("sampling", [
    Sampling(temperature=0.05),                       # nearly the argmax: long accepted runs
    Sampling(temperature=0.7),
    Sampling(temperature=1.0, top_k=3),
    Sampling(temperature=0.8, top_p=0.9),
], ids=["t0.05", "t0.7", "t1-k3", "t0.8-p0.9"])
@pytest.mark.parametrize("burst", [1, 4, 16])
def test_a_sampled_request_speculates_and_draws_what_the_plain_loop_draws_with_its_seed(latch, sampling, burst):
    # Each token after a verify row is the draw at that row's position: with the seed the engine
    # drew, the plain loop's (the fake's verify rows are its plain logits).
    spec = engine(latch, burst=burst, script={"vocab": 24})
    got = list(spec.generate(PROMPT, 90, sampling=sampling))
    assert spec.stats.speculation == "on" and spec.stats.seed is not None
    seeded = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed=spec.stats.seed)
    assert got == list(engine(latch, k=0, burst=burst, script={"vocab": 24}).generate(PROMPT, 90, sampling=seeded))
    if sampling.temperature == 0.05 and burst > 1:  # the draws follow the cycle: drafts match
        assert spec.device.spec_steps > 0 and spec.stats.tokens_per_step > 2


def test_sampled_speculative_tokens_are_draws_not_argmaxes(latch):
    # At temperature 1 the draws leave the scripted argmax often; the speculative loop keeps the
    # draws (not the verify rows' argmaxes) and accepts drafts only where they equal them.
    spec = engine(latch, burst=8, script={"vocab": 4})
    got = list(spec.generate(PROMPT, 200, sampling=Sampling(temperature=1.0)))
    seeded = Sampling(temperature=1.0, seed=spec.stats.seed)
    assert got == list(engine(latch, k=0, burst=8, script={"vocab": 4}).generate(PROMPT, 200, sampling=seeded))
    assert got != reference(200, lambda tok, pos: cycle_next(tok, pos) % 4)
    assert spec.device.spec_steps > 0  # a 4-token vocabulary repeats itself: drafts are tried


@pytest.mark.parametrize("seed", [5, 11, 2024])
@pytest.mark.parametrize("sampling", [Sampling(temperature=0.05), Sampling(temperature=1.0, top_k=3, top_p=0.9)],
                         ids=["t0.05", "t1-k3-p0.9"])
def test_a_sampled_request_with_its_own_seed_speculates_and_gives_the_plain_loops_tokens(latch, sampling, seed):
    sampling = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)
    eng = engine(latch, burst=4, script={"vocab": 6})
    got = list(eng.generate(PROMPT, 60, sampling=sampling))
    assert eng.stats.speculation == "on" and eng.stats.seed == seed
    assert got == list(engine(latch, k=0, burst=4, script={"vocab": 6}).generate(PROMPT, 60, sampling=sampling))
    assert eng.device.spec_steps > 0  # a 6-token vocabulary repeats itself: drafts are tried


def test_text_without_repetition_never_speculates(latch):
    eng = engine(latch, rule=lambda tok, pos: (tok * 7 + pos * pos) % 61, script={"vocab": 64}, burst=4)
    list(eng.generate(PROMPT, 120))
    st = eng.stats
    assert st.spec_steps == 0 and st.speculation == "on"  # allowed, never chosen
    assert st.weight_reads >= 116


def test_engine_without_speculation_never_speculates(latch):
    eng = engine(latch, burst=4, speculate=False)
    assert list(eng.generate(PROMPT, 30)) == reference(30, cycle_next)
    assert eng.stats.speculation == "off" and eng.device.spec_steps == 0


def test_the_bench_times_each_verify_product_in_its_format_and_runs_of_q_k_v():
    from arcpy.bench.speculate import verify_products
    from arcpy.codes import FORMAT_BF16, FORMAT_Q4_0, FORMAT_Q4_1, FORMAT_Q4_K, FORMAT_Q5_K, FORMAT_Q6_K, FORMAT_Q8_0
    from arcpy.model import SHAPES
    cfg = SHAPES["llama8B-q4km"]  # layer 0: q and k Q4_K, v and down Q6_K (llama.cpp's more bits)
    assert verify_products("llama8B-q4km", cfg) == [
        ("qk", 5120, 4096, False, FORMAT_Q4_K), ("v", 1024, 4096, False, FORMAT_Q6_K),
        ("o", 4096, 4096, False, FORMAT_Q4_K), ("gate/up swiglu", 14336, 4096, True, FORMAT_Q4_K),
        ("down", 4096, 14336, False, FORMAT_Q6_K), ("lm_head", 128256, 4096, False, FORMAT_Q6_K)]
    tiny = verify_products("tiny-quant", SHAPES["tiny-quant"])
    assert [(name, fmt) for name, _, _, _, fmt in tiny] == [
        ("q", FORMAT_Q4_K), ("k", FORMAT_Q6_K), ("v", FORMAT_Q8_0), ("o", FORMAT_Q4_0),
        ("gate/up swiglu", FORMAT_Q5_K), ("down", FORMAT_Q4_1), ("lm_head", FORMAT_Q6_K)]
    assert verify_products("tiny-quant-tied", SHAPES["tiny-quant-tied"])[-1][-1] == FORMAT_BF16
    assert [p[:2] for p in verify_products("llama8B", SHAPES["llama8B"])][:1] == [("qkv", 6144)]


def test_the_looping_bench_model_zeroes_quantized_outputs_too():
    from arcpy.bench.speculate import looping
    from arcpy.model import synthetic_model
    from arcpy.model.quant import QuantTensor, dequantize
    model = synthetic_model("tiny-quant", seed=0)
    looping(model)
    outs = {n: t for n, t in model.tensors.items() if n.endswith(("o_proj.weight", "down_proj.weight"))}
    assert len(outs) == 4 and any(isinstance(t, QuantTensor) for t in outs.values())
    for name, t in outs.items():
        w = dequantize(t) if isinstance(t, QuantTensor) else t
        assert not np.any(w), name
    assert np.any(dequantize(model.tensors["model.layers.0.self_attn.q_proj.weight"]))
