"""The gates of docs/ARCHITECTURE.md's section 3, read by value, and the process-wide fallback latch."""

import pytest

from arcpy.devices.protocol import Capabilities
from arcpy.devices.sequence import SequenceSpec
from arcpy.errors import InvalidArgumentError
from arcpy.loop import gate
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


def admission(env, greedy=True, requested=None, stops=0, latch=None, loop=True, sampling=True, verify=None):
    caps = Capabilities("test", loop=loop, sampling=sampling)
    spec = SequenceSpec((1,), 1, stop_ids=tuple(range(stops)),
                        sampling=Sampling() if greedy else Sampling(temperature=0.7, seed=3))
    return gate.device_loop_admission(requested, caps, spec, environ=env, latch=latch or gate.FallbackLatch(),
                                      verify=verify)


def test_device_loop_is_on_when_unset_where_the_backend_has_one():
    assert admission({}) == (True, "admitted")
    ok, why = admission({}, loop=False)
    assert not ok and "no captured graph" in why


@pytest.mark.parametrize("value", ["0", "false", "off", "no", ""])
def test_device_loop_pinned_off_by_the_environment(value):
    assert admission({gate.DEVICE_LOOP: value}) == (False, "ARC_GRAPH_DEVICE_LOOP is off")


def test_every_gate_default_is_what_read_all_accepts_and_the_loop_is_on():
    assert gate.DEFAULTS == {gate.DEVICE_LOOP: True, gate.GRAPH: True, gate.VERIFY_ALWAYS: False}
    gate.read_all({})
    with pytest.raises(InvalidArgumentError, match="ARC_GRAPH_VERIFY_ALWAYS='2'"):
        gate.read_all({gate.VERIFY_ALWAYS: "2"})


def test_explicit_request_overrides_the_environment():
    assert admission({gate.DEVICE_LOOP: "0"}, requested=True)[0] is True
    assert admission({gate.DEVICE_LOOP: "1"}, requested=False)[0] is False
    assert admission({}, requested=False)[0] is False


def test_verify_always_makes_the_loop_stand_aside():
    ok, why = admission({gate.VERIFY_ALWAYS: "1"})
    assert not ok and gate.VERIFY_ALWAYS in why
    ok, why = admission({}, verify=True)
    assert not ok and gate.VERIFY_ALWAYS in why
    assert admission({gate.VERIFY_ALWAYS: "1"}, verify=False)[0] is True


def test_sampling_is_admitted_where_the_device_loop_draws_and_refused_by_name_elsewhere():
    for s in [Sampling(), Sampling(temperature=0.7, top_k=1), Sampling(temperature=0.7, seed=3)]:
        assert admission({}, greedy=Sampler(s).greedy)[0] is True
        ok, why = admission({}, greedy=Sampler(s).greedy, sampling=False)
        assert ok == s.is_greedy()
        assert ok or "non-greedy sampling" in why


def test_more_stop_ids_than_the_commit_kernel_holds_are_refused():
    ok, why = admission({}, stops=9)
    assert not ok and "at most 8" in why


def test_latch_refuses_after_a_failure_and_logs_once(caplog):
    latch = gate.FallbackLatch()
    latch.trip("first")
    latch.trip("second")
    ok, why = admission({}, latch=latch)
    assert not ok and "first" in why
    assert sum("device loop disabled" in r.message for r in caplog.records) == 1
