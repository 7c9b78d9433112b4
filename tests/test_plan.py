"""A request's plan (arcpy/loop/plan.py), with no device: its checks, its path and the reason for
it, and what the device is to write at the sequence's start."""

import pytest

from arcpy.devices.protocol import Capabilities
from arcpy.devices.sequence import SequenceSpec
from arcpy.errors import InvalidArgumentError
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.plan import Settings, plan_sequence, sequence_spec
from arcpy.loop.stats import CONTEXT_FULL, TOKEN_BUDGET
from arcpy.sampling import Sampling

GPU = Capabilities("gpu", loop=True, sampling=True, prefill=True, logprobs=True, logit_bias=True, masks=True)
SETTINGS = Settings(environ={}, latch=FallbackLatch())


def planned(spec, caps=GPU, settings=SETTINGS, max_seq=64):
    return plan_sequence(spec, caps, 100, max_seq, settings)


def test_a_plain_request_runs_on_the_device_loop_prefilled():
    p = planned(sequence_spec([1, 2, 3], 8, stop_ids=[7, 7, 9]))
    assert p.loop and p.reason == "admitted" and p.prefill and p.speculate
    assert p.spec.stop_ids == (7, 9) and p.max_new == 8 and p.budget_reason == TOKEN_BUDGET
    start = p.device_start(None, None, restored=False)
    assert start.loop and start.stop_ids == (7, 9) and start.input == (3, 2)
    assert start.history is None and start.draft_memory is None and start.logit_bias == ()


def test_the_budget_is_cut_to_the_room_the_context_has():
    p = planned(sequence_spec(range(60), 10), max_seq=64)
    assert p.max_new == 4 and p.budget_reason == CONTEXT_FULL


@pytest.mark.parametrize("caps, spec, reason", [
    (Capabilities("cpu", prefill=True), SequenceSpec((1,), 4), "no captured graph"),
    (Capabilities("gpu", loop=True), SequenceSpec((1,), 4, sampling=Sampling(temperature=0.7, seed=1)),
     "non-greedy sampling"),
    (GPU, SequenceSpec((1,), 4, stop_ids=tuple(range(9))), "at most 8"),
    (Capabilities("gpu", loop=True), SequenceSpec((1,), 4, logprobs=2),
     "log-probabilities: this device loop writes none"),
    (Capabilities("gpu", loop=True), SequenceSpec((1,), 4, logit_bias=((5, 1.0),)),
     "logit_bias: this device loop adds none"),
    (Capabilities("gpu", loop=True), SequenceSpec((1,), 4, matcher=object()), "constrained output"),
])
def test_what_the_device_cannot_do_takes_the_host_path_by_name(caps, spec, reason):
    ok, why = caps.admits(spec)
    assert not ok and reason in why
    p = planned(spec, caps)
    assert not p.loop and reason in p.reason


def test_a_bias_goes_to_the_device_unless_every_step_is_verified():
    spec = sequence_spec([1, 2], 4, logit_bias={5: 2.0})
    assert planned(spec).bias_on_device and planned(spec).device_start(None, None, False).logit_bias == ((5, 2.0),)
    verified = planned(spec, settings=Settings(verify=True, environ={}, latch=FallbackLatch()))
    assert not verified.loop and not verified.bias_on_device and not verified.prefill
    assert verified.device_start(None, None, False).logit_bias == ()


def test_the_history_is_written_where_the_prefill_does_not_write_it_whole():
    spec = sequence_spec([1, 2, 3], 4)
    assert planned(spec).device_start(None, [4, -1], restored=False).history is None
    assert planned(spec).device_start(None, [4, -1], restored=True).history == (1, 2, 3)
    token_by_token = planned(spec, settings=Settings(prefill=False, environ={}, latch=FallbackLatch()))
    start = token_by_token.device_start(None, [4, -1], restored=False)
    assert start.history == (1, 2, 3) and start.input is None and start.draft_memory == (4, -1)


def test_a_request_the_device_cannot_take_is_refused_before_any_device_work():
    with pytest.raises(InvalidArgumentError, match="the prompt is empty"):
        planned(sequence_spec([], 4))
    with pytest.raises(InvalidArgumentError, match="max_new_tokens must be an integer"):
        planned(sequence_spec([1], -1))
    with pytest.raises(InvalidArgumentError):
        planned(sequence_spec([1, 100], 4))  # outside the vocabulary of 100
