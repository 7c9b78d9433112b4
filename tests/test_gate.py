"""The gates of DESIGN section 6, read by value, and the process-wide fallback latch."""

import pytest

from arcpy import gate
from arcpy.errors import InvalidArgumentError
from arcpy.sampling import Sampler, Sampling


@pytest.mark.parametrize("value", ["1", "true", "ON", " yes "])
def test_flag_enable_values(value):
    assert gate.read_flag(gate.DEVICE_LOOP, False, {gate.DEVICE_LOOP: value}) is True


@pytest.mark.parametrize("value", ["0", "false", "Off", "no", ""])
def test_flag_explicit_refusals_including_empty(value):
    assert gate.read_flag(gate.DEVICE_LOOP, True, {gate.DEVICE_LOOP: value}) is False


def test_unrecognised_flag_value_is_an_error_naming_the_variable():
    with pytest.raises(InvalidArgumentError, match="ARC_GRAPH_DEVICE_LOOP='maybe'"):
        gate.read_flag(gate.DEVICE_LOOP, False, {gate.DEVICE_LOOP: "maybe"})


def admission(env, greedy=True, requested=None, stops=0, latch=None):
    return gate.device_loop_admission(requested, greedy, True, stops, env, latch or gate.FallbackLatch())


def test_device_loop_is_off_when_unset():
    assert admission({}) == (False, "ARC_GRAPH_DEVICE_LOOP is off")
    assert admission({gate.DEVICE_LOOP: "1"})[0] is True


def test_explicit_request_overrides_the_environment():
    assert admission({gate.DEVICE_LOOP: "0"}, requested=True)[0] is True
    assert admission({gate.DEVICE_LOOP: "1"}, requested=False)[0] is False


def test_verify_always_makes_the_loop_stand_aside():
    ok, why = admission({gate.DEVICE_LOOP: "1", gate.VERIFY_ALWAYS: "1"})
    assert not ok and gate.VERIFY_ALWAYS in why


def test_non_greedy_sampling_is_refused_and_greedy_mirrors_the_sampler():
    for s in [Sampling(), Sampling(temperature=0.7, top_k=1), Sampling(temperature=0.7)]:
        ok, _ = admission({gate.DEVICE_LOOP: "1"}, greedy=Sampler(s).greedy)
        assert ok == s.is_greedy()
    # top_k 1 is trivially greedy whatever the temperature: the sampler takes the argmax.
    assert Sampler(Sampling(temperature=0.7, top_k=1, seed=0)).sample([0.1, 0.9, 0.3]) == 1


def test_more_stop_ids_than_the_commit_kernel_holds_are_refused():
    ok, why = admission({gate.DEVICE_LOOP: "1"}, stops=9)
    assert not ok and "at most 8" in why


def test_latch_refuses_after_a_failure_and_logs_once(caplog):
    latch = gate.FallbackLatch()
    latch.trip("first")
    latch.trip("second")
    ok, why = admission({gate.DEVICE_LOOP: "1"}, latch=latch)
    assert not ok and "first" in why
    assert sum("device loop disabled" in r.message for r in caplog.records) == 1


def test_sampling_arguments_are_validated():
    with pytest.raises(InvalidArgumentError):
        Sampling(temperature=-1.0)
    with pytest.raises(InvalidArgumentError):
        Sampling(top_p=0.0)
    with pytest.raises(InvalidArgumentError):
        Sampling(top_k=-2)
