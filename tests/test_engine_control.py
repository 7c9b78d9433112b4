"""Engine control logic against FakeDevice: both paths, parked tokens, fallback, poisoning."""

import logging

import numpy as np
import pytest
from scripted_tokens import scripted_tokens

from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.errors import (ContextLostError, DegenerateLogitsError, DeviceFaultError, InvalidArgumentError,
                          NonFiniteLogitsError)
from arcpy.loop import gate
from arcpy.loop.engine import DEVICE_LOOP, HOST, Engine
from arcpy.loop.settings import EngineSettings
from arcpy.sampling import Sampling

PROMPT = [1, 2, 3]


def reference(n, prompt=PROMPT):
    return scripted_tokens(prompt, n, 64)


def engine(latch, script=None, loop=True, **kw):
    return Engine(FakeDevice(script), "fake", EngineSettings(device_loop=loop, **kw), environ={}, latch=latch)


@pytest.mark.parametrize("burst", [1, 4, 16])
def test_device_loop_tokens_equal_host_path_tokens(latch, burst):
    loop = engine(latch, burst=burst)
    host = engine(latch, loop=False)
    got = list(loop.generate(PROMPT, 40))
    assert loop.stats.path == DEVICE_LOOP
    assert got == list(host.generate(PROMPT, 40)) == reference(40)
    assert host.stats.path == HOST


def test_generate_streams_tokens_while_the_burst_is_still_running(latch):
    eng = engine(latch, burst=16)
    gen = eng.generate(PROMPT, 16)
    next(gen)
    assert len(eng.device.queue) > 1  # later steps of the burst have not retired yet
    gen.close()


@pytest.mark.parametrize("prefill", [True, False])
def test_device_loop_makes_zero_host_waits_per_token(latch, prefill):
    eng = engine(latch, burst=8, prefill=prefill)
    list(eng.generate(PROMPT, 64))
    assert eng.stats.host_waits == 0 and eng.stats.prefill is prefill
    # With the prefill, the first token is its commit's: no graph launch; without, the prompt's
    # tokens but the last go through the forward's graph one by one.
    assert eng.stats.graph_launches == (63 if prefill else 64 + len(PROMPT) - 1)


def test_host_path_waits_once_per_token(latch):
    eng = engine(latch, loop=False)
    list(eng.generate(PROMPT, 20))
    assert eng.stats.host_waits == 20


def test_burst_is_clipped_to_the_remaining_budget(latch):
    eng = engine(latch, burst=4)
    assert len(list(eng.generate(PROMPT, 10))) == 10
    assert eng.device.steps_enqueued == 10


def test_without_prefill_the_prompt_goes_token_by_token_without_host_waits(latch):
    eng = engine(latch, loop=False, prefill=False)
    prompt = list(range(1, 30))
    list(eng.generate(prompt, 1))
    assert eng.stats.host_waits == 1
    assert eng.stats.graph_launches == len(prompt)
    assert eng.device.prefills == []


@pytest.mark.parametrize("loop", [True, False])
def test_the_prompt_goes_through_one_prefill_and_its_logits_give_the_first_token(latch, loop):
    eng = engine(latch, loop=loop, burst=4)
    prompt = list(range(1, 30))
    got = list(eng.generate(prompt, 10))
    assert eng.device.prefills == [(tuple(prompt), 0)]
    assert got == reference(10, prompt)
    assert eng.stats.host_waits == (0 if loop else 10)
    # the loop: 10 steps, the first of them the prefill's commit; the host path: 9 forwards
    assert eng.stats.graph_launches == 9
    if loop:
        assert eng.device.log[0] == "step 0 burst 1 (commit)" and "(commit)" not in eng.device.log[1]


@pytest.mark.parametrize("burst", [1, 3, 16])
def test_prefill_then_loop_equals_token_by_token_host_path_with_sampling(latch, burst):
    s = Sampling(temperature=0.9, top_p=0.9, seed=5)
    a = list(engine(latch, burst=burst).generate(PROMPT, 30, sampling=s))
    b = list(engine(latch, loop=False, prefill=False).generate(PROMPT, 30, sampling=s))
    assert a == b


def test_a_stop_id_that_is_the_prefills_own_token_ends_the_first_burst(latch):
    first = reference(1)[0]
    eng = engine(latch, burst=8)
    assert list(eng.generate(PROMPT, 20, stop_ids=[first])) == []  # a stop id is never handed out
    assert eng.stats.finish_reason == "stop_id" and eng.stats.stop_id == first
    eng.device.stream_query()
    while not eng.device.stream_query():
        pass
    assert eng.device.poll_ring().published == 1  # the rest of the burst published nothing


def test_a_fault_on_the_prefills_commit_falls_back_and_recomputes_the_token(latch):
    eng = engine(latch, FakeScript(lost_steps=frozenset({0})), burst=4)
    assert list(eng.generate(PROMPT, 12)) == reference(12)
    assert eng.stats.fallback is not None


def test_verify_always_feeds_the_prompt_token_by_token(latch):
    eng = engine(latch, loop=False, verify=True)
    list(eng.generate(PROMPT, 3))
    assert eng.device.prefills == [] and not eng.stats.prefill


def test_step_hands_out_parked_tokens_in_order(latch):
    eng = engine(latch, burst=4)
    eng.start(PROMPT, 8)
    first = eng.step()
    assert list(eng.parked) == reference(4)[1:]
    rest = [eng.step() for _ in range(7)]
    assert [first] + rest == reference(8)
    assert eng.step() is None


def test_parked_tokens_cleared_on_completion_no_stale_token_in_next_sequence(latch):
    # The predecessor's leak: a device that publishes past a stop id leaves tokens parked when
    # the sequence stops mid-burst; the next sequence's first step must not take one of them.
    toks = reference(8)
    eng = engine(latch, FakeScript(honor_stop_ids=False), burst=8)
    eng.start(PROMPT, 8, stop_ids=[toks[1]])
    assert [eng.step(), eng.step()] == [toks[0], None]  # the stop id ends it, unseen
    assert eng.step() is None and not eng.parked and eng.stats.stop_id == toks[1]
    other = [7, 9]
    eng.start(other, 3)
    assert [eng.step() for _ in range(3)] == reference(3, other)


def test_parked_tokens_cleared_on_preemption(latch):
    eng = engine(latch, burst=8)
    eng.start(PROMPT, 8)
    eng.step()
    assert eng.parked
    other = [11]
    eng.start(other, 2)
    assert not eng.parked
    assert [eng.step(), eng.step()] == reference(2, other)


def test_parked_tokens_cleared_on_fallback(latch):
    eng = engine(latch, FakeScript(fault_word_at=2), burst=4)
    eng.start(PROMPT, 6)
    got = [eng.step() for _ in range(6)]
    assert got == reference(6)
    assert eng.stats.fallback is not None


def test_finish_clears_parked_tokens(latch):
    eng = engine(latch, burst=8)
    eng.start(PROMPT, 8)
    eng.step()
    eng.finish()
    assert not eng.parked and eng.step() is None


def test_fault_word_falls_back_to_host_path_and_latches_off(latch, caplog):
    eng = engine(latch, FakeScript(fault_word_at=3), burst=4)
    with caplog.at_level(logging.WARNING, logger="arcpy"):
        got = list(eng.generate(PROMPT, 12))
    assert got == reference(12)
    assert eng.stats.path == f"{DEVICE_LOOP}+{HOST}"
    assert latch.latched and "token out of range" in latch.reason
    list(eng.generate(PROMPT, 4))
    assert eng.stats.path == HOST
    assert sum("disabled for this process" in r.message for r in caplog.records) == 1


def test_out_of_range_token_error_names_token_and_position(latch):
    # A padded lm_head: the argmax lands outside the vocabulary on both paths.
    script = FakeScript(next_token=lambda t, p: 70 if p == 4 else (t + 1) % 64)
    eng = engine(latch, script, burst=4)
    with pytest.raises(DeviceFaultError, match="token 70 at position 5"):
        list(eng.generate(PROMPT, 8))
    assert latch.latched and "token 70 at position 5" in latch.reason


def test_short_burst_falls_back_with_identical_tokens(latch):
    eng = engine(latch, FakeScript(lost_steps=frozenset({2})), burst=4)
    eng.max_spins = eng.driver.max_spins = 100_000
    eng.driver.query_every = 8
    assert list(eng.generate(PROMPT, 10)) == reference(10)
    assert "idle" in eng.stats.fallback


def test_sticky_fault_poisons_the_engine_and_refuses_further_work(latch):
    eng = engine(latch, FakeScript(sticky_fault_at=2), burst=4)
    eng.driver.query_every = 8
    with pytest.raises(ContextLostError):
        list(eng.generate(PROMPT, 8))
    with pytest.raises(DeviceFaultError, match="unusable"):
        eng.start(PROMPT, 2)


def test_hang_raises_and_poisons(latch):
    eng = engine(latch, FakeScript(hang_at=1), burst=4)
    eng.driver.max_spins = 2_000
    with pytest.raises(DeviceFaultError, match="no token and no error"):
        list(eng.generate(PROMPT, 8))
    assert eng.poisoned


def test_stop_id_ends_generation_on_both_paths(latch):
    toks = reference(10)
    for loop in (True, False):
        eng = engine(latch, loop=loop, burst=4)
        assert list(eng.generate(PROMPT, 10, stop_ids=[toks[5]])) == toks[:5]
        assert eng.stats.finish_reason == "stop_id" and eng.stats.stop_id == toks[5] and eng.stats.tokens == 6


def test_verify_always_compares_replay_and_eager(latch):
    eng = engine(latch, verify=True)
    assert list(eng.generate(PROMPT, 4)) == reference(4)
    assert eng.stats.path == HOST
    bad = engine(latch, FakeScript(eager_offset=1e-3), verify=True)
    with pytest.raises(DeviceFaultError, match="disagree"):
        list(bad.generate(PROMPT, 4))


SAMPLED = Sampling(temperature=0.9, top_k=20, top_p=0.95, seed=1234)


def host_sampled(latch, n, sampling=SAMPLED, device=None):
    eng = Engine(device or FakeDevice(), "fake", EngineSettings(device_loop=False), environ={}, latch=latch)
    toks = list(eng.generate(PROMPT, n, sampling=sampling))
    assert eng.stats.path == HOST
    return toks


def test_the_device_loop_is_the_default_and_the_environment_can_pin_it_off(latch):
    on = Engine(FakeDevice(), "fake", environ={}, latch=latch)
    assert list(on.generate(PROMPT, 4)) == reference(4) and on.stats.path == DEVICE_LOOP
    off = Engine(FakeDevice(), "fake", environ={gate.DEVICE_LOOP: "off"}, latch=latch)
    assert list(off.generate(PROMPT, 4)) == reference(4) and off.stats.path == HOST
    assert off.path_reason == "ARC_GRAPH_DEVICE_LOOP is off"


@pytest.mark.parametrize("burst", [1, 3, 16])
def test_a_seeded_sampled_sequence_draws_the_same_tokens_on_the_device_loop_and_the_host_path(latch, burst):
    want = host_sampled(latch, 40)
    assert want != reference(40)  # drawn, not the argmax
    eng = engine(latch, burst=burst)
    assert list(eng.generate(PROMPT, 40, sampling=SAMPLED)) == want
    assert eng.stats.path == DEVICE_LOOP and eng.stats.host_waits == 0
    assert eng.stats.seed == SAMPLED.seed


@pytest.mark.parametrize("script", [FakeScript(fault_word_at=5), FakeScript(lost_steps=frozenset({6}))],
                         ids=["fault-word", "lost-step"])
def test_a_fallback_in_the_middle_of_a_sampled_sequence_keeps_drawing_the_same_tokens(latch, script):
    want = host_sampled(latch, 24)
    eng = engine(latch, script, burst=4)
    eng.max_spins = eng.driver.max_spins = 100_000
    eng.driver.query_every = 8
    eng.start(PROMPT, 24, sampling=SAMPLED)
    got = [eng.step() for _ in range(24)]
    assert eng.stats.path == f"{DEVICE_LOOP}+{HOST}" and eng.stats.fallback
    assert got == want


def test_two_seeds_draw_different_sequences(latch):
    a = list(engine(latch).generate(PROMPT, 32, sampling=SAMPLED))
    b = list(engine(latch).generate(PROMPT, 32, sampling=Sampling(0.9, 20, 0.95, seed=1235)))
    assert a != b


def test_an_unseeded_sequence_is_reproduced_from_the_seed_it_reports(latch):
    eng = engine(latch)
    got = list(eng.generate(PROMPT, 32, sampling=Sampling(temperature=0.9)))
    assert eng.stats.path == DEVICE_LOOP
    seed = eng.stats.seed
    assert seed == eng.seq.sampler.params.seed
    assert host_sampled(latch, 32, Sampling(temperature=0.9, seed=seed)) == got


def test_sampling_takes_the_host_path_where_the_device_loop_has_no_sampler(latch):
    eng = Engine(FakeDevice(FakeScript(supports_sampling=False)), "fake", environ={}, latch=latch)
    assert list(eng.generate(PROMPT, 16, sampling=SAMPLED)) == host_sampled(latch, 16)
    assert eng.stats.path == HOST and "non-greedy sampling" in eng.path_reason
    assert list(eng.generate(PROMPT, 8)) == reference(8) and eng.stats.path == DEVICE_LOOP


def test_a_greedy_sequence_after_a_sampled_one_takes_the_argmax_again(latch):
    eng = engine(latch, burst=4)
    list(eng.generate(PROMPT, 8, sampling=SAMPLED))
    assert list(eng.generate(PROMPT, 12)) == reference(12)
    assert eng.stats.seed is None


def test_verify_always_draws_sampled_tokens_as_the_host_path_does(latch):
    eng = engine(latch, verify=True)
    assert list(eng.generate(PROMPT, 16, sampling=SAMPLED)) == host_sampled(latch, 16)
    assert eng.stats.path == HOST


class PaddedHead(FakeDevice):
    """An lm_head wider than the vocabulary, its padding holding the largest logits."""

    def host_logits(self):
        return np.concatenate([super().host_logits(), np.full(8, 9.0, np.float32)])


def test_the_host_path_draws_from_the_valid_ids_only(latch):
    loop = list(engine(latch).generate(PROMPT, 24, sampling=SAMPLED))
    assert host_sampled(latch, 24, device=PaddedHead()) == loop


def test_batch_size_other_than_one_is_refused(latch):
    eng = engine(latch)
    with pytest.raises(InvalidArgumentError, match="batch size 2"):
        eng.start(PROMPT, 4, batch_size=2)


@pytest.mark.parametrize("prompt, stops, message", [
    ([], (), "empty"),
    ([1, 64], (), "token id 64"),
    ([1, -1], (), "token id -1"),
    ([1], (99,), "token id 99"),
])
def test_bad_prompts_and_stop_ids_are_refused(latch, prompt, stops, message):
    eng = engine(latch)
    with pytest.raises(InvalidArgumentError, match=message):
        eng.start(prompt, 4, stop_ids=stops)


def test_prompt_longer_than_max_seq_is_refused_and_budget_clipped(latch):
    eng = engine(latch, FakeScript(max_seq=8))
    with pytest.raises(InvalidArgumentError, match="max_seq 8"):
        eng.start(list(range(8)), 1)
    assert len(list(eng.generate(list(range(5)), 100))) == 3


@pytest.mark.parametrize("loop", [False, True], ids=["host-path", "device-loop"])
def test_non_finite_logits_are_an_error_on_both_paths_without_fallback(latch, loop):
    eng = engine(latch, FakeScript(nan_at_position=5), loop=loop, burst=4)
    got = []
    with pytest.raises(NonFiniteLogitsError, match="position 5"):
        for tok in eng.generate(PROMPT, 16):
            got.append(tok)
    assert got == reference(3)  # the tokens of positions 2, 3 and 4 came first
    assert not latch.latched and eng.poisoned is None
    assert eng.stats.finish_reason == "fault"


@pytest.mark.parametrize("sampling", [None, Sampling(temperature=0.8, seed=3)], ids=["greedy", "sampled"])
@pytest.mark.parametrize("loop", [False, True], ids=["host-path", "device-loop"])
def test_degenerate_logits_are_an_error_on_both_paths_without_fallback(latch, loop, sampling):
    eng = engine(latch, FakeScript(flat_at_position=4), loop=loop, burst=4)
    got = []
    with pytest.raises(DegenerateLogitsError, match="position 4"):
        for tok in eng.generate(PROMPT, 16, sampling=sampling):
            got.append(tok)
    assert len(got) == 2  # the tokens of positions 2 and 3 came first
    if sampling is None:
        assert got == reference(2)
    assert not latch.latched and eng.poisoned is None
    assert eng.stats.finish_reason == "fault"


def test_engine_is_a_context_manager_that_frees_its_device(latch):
    with engine(latch) as eng:
        list(eng.generate(PROMPT, 4))
    assert eng.device.closed


def test_every_gate_is_read_on_every_backend(latch):
    with pytest.raises(InvalidArgumentError, match="ARC_GRAPH='2'"):
        Engine(FakeDevice(), "fake", environ={"ARC_GRAPH": "2"}, latch=latch)


def test_the_budget_and_the_context_are_told_apart_as_finish_reasons(latch):
    eng = engine(latch, FakeScript(max_seq=16))
    list(eng.generate(PROMPT, 4))
    assert eng.stats.finish_reason == "token_budget"
    list(eng.generate(PROMPT, 100))  # 13 positions are left after the prompt
    assert eng.stats.finish_reason == "context_full" and eng.stats.tokens == 13


def word_text(words):
    """A TextSpec whose token i is words[i] followed by a space, and a one-line chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from arcpy.text import TextSpec
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens(["END"])  # the model's end id, never text
    template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return TextSpec(tok, bos_id=None, eos_ids=(words.index("END"),), add_bos=False, chat_template=template)


@pytest.mark.parametrize("loop", [False, True], ids=["host-path", "device-loop"])
def test_chat_streams_the_answer_as_text_and_stops_at_the_model_s_end_id(latch, loop):
    words = ["?", "hello", "there", "general", "kenobi", "END"]
    answer = {1: 2, 2: 3, 3: 4, 4: 5}  # each word is followed by the next; "kenobi" by END
    eng = engine(latch, FakeScript(vocab=len(words), next_token=lambda tok, pos: answer.get(tok, 0)), loop=loop)
    eng.text = word_text(words)
    assert "".join(eng.chat([{"role": "user", "content": "hello"}])) == "there general kenobi"
    assert eng.stats.finish_reason == "stop_id"


def test_chat_ends_at_a_stop_string_that_never_reaches_the_caller(latch):
    words = ["?", "hello", "there", "general", "kenobi", "END"]
    answer = {1: 2, 2: 3, 3: 4, 4: 5}
    eng = engine(latch, FakeScript(vocab=len(words), next_token=lambda tok, pos: answer.get(tok, 0)))
    eng.text = word_text(words)
    assert "".join(eng.chat([{"role": "user", "content": "hello"}], stop=["al ke"])) == "there gener"
    assert eng.stats.finish_reason == "stop_string"


def test_chat_without_the_model_s_text_is_one_clear_error(latch):
    with pytest.raises(InvalidArgumentError, match="messages need the model's tokenizer"):
        list(engine(latch).chat([{"role": "user", "content": "hi"}]))


def test_each_device_states_its_capabilities_in_one_record():
    from arcpy.devices.numpy_device import NumpyDevice
    from arcpy.devices.protocol import Capabilities
    from arcpy.devices.reference import ReferenceModel
    from arcpy.model import random_model, SHAPES

    fake = FakeDevice(FakeScript(supports_sampling=False, speculate_k=4, speculate_ngram=2))
    assert fake.capabilities == Capabilities("fake GPU (scripted)", loop=True, sampling=False, prefill=True,
                                             speculate_k=4, speculate_ngram=2, logprobs=True, logit_bias=True,
                                             prefix_granule=1, masks=True)
    fake.supports_loop = False  # what a device can do is read when asked
    assert not fake.capabilities.loop
    cpu = NumpyDevice(ReferenceModel(random_model(SHAPES["stories15M"], seed=0), 16))
    assert cpu.capabilities == Capabilities("CPU (NumPy reference backend)", prefill=True, prefix_granule=64,
                                            prefix_row_bytes=cpu.prefix_row_bytes)
    assert cpu.prefix_row_bytes > 0
