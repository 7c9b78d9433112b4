"""BurstDriver against the scripted FakeDevice: ordering, the three fault signals, max_spins.

The fake's tokens come from TOKENS, a table written here: what a test expects is what it wrote,
not what the fake computes.
"""

import pytest

from arcpy.codes import FAULT_POSITION_RANGE, FAULT_TOKEN_RANGE
from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.devices.protocol import RingState
from arcpy.devices.sequence import SequenceStart
from arcpy.errors import (ContextLostError, DegenerateLogitsError, FaultWordError, HangError, NonFiniteLogitsError,
                          ShortBurstError)
from arcpy.loop.burst import BurstDriver
from arcpy.sampling import Sampling

# The token the forward at position p produces, whatever the input token.
TOKENS = [11, 42, 7, 63, 0, 19, 5, 33, 60, 2, 48, 27, 9, 51, 14, 38]


def expected_tokens(n):
    return TOKENS[:n]


def driver_for(script=None, stop_ids=(), **kw):
    script = script or FakeScript()
    script.next_token = lambda token, position: TOKENS[position % len(TOKENS)]
    dev = FakeDevice(script)
    drv = BurstDriver(dev, **kw)
    drv.begin_sequence(SequenceStart(loop=True, stop_ids=tuple(stop_ids)))
    dev.set_input(5, 0)
    return dev, drv


def test_burst_yields_the_scripted_tokens_in_order():
    dev, drv = driver_for()
    assert list(drv.run(8)) == expected_tokens(8)


def test_burst_enqueues_every_step_before_the_first_token_is_read():
    dev, drv = driver_for()
    gen = drv.run(6)
    next(gen)
    assert dev.steps_enqueued == 6


def test_ring_count_continues_across_bursts_of_one_sequence():
    dev, drv = driver_for()
    tokens = list(drv.run(3)) + list(drv.run(4))
    assert tokens == expected_tokens(7)
    assert drv.published == 7


def test_no_stream_query_while_tokens_keep_landing():
    dev, drv = driver_for(FakeScript(latency=5), query_every=64)
    before = dev.queries
    list(drv.run(16))
    assert dev.queries == before


def test_fault_word_raises_naming_token_and_position():
    dev, drv = driver_for(FakeScript(fault_word_at=2, fault_code=FAULT_TOKEN_RANGE))
    got = []
    with pytest.raises(FaultWordError) as info:
        for tok in drv.run(4):
            got.append(tok)
    assert got == expected_tokens(2)
    err = info.value
    assert (err.code, err.position) == (FAULT_TOKEN_RANGE, 3)
    assert f"token {err.token} at position 3" in str(err)


def test_fault_word_is_read_even_when_the_stream_never_goes_idle():
    # The fault step is followed by a hang: only the fault word can explain the stall.
    dev, drv = driver_for(FakeScript(fault_word_at=1, hang_at=2), max_spins=10_000)
    with pytest.raises(FaultWordError):
        list(drv.run(4))


def test_position_range_fault_is_reported_as_such():
    dev, drv = driver_for(FakeScript(max_seq=3))
    with pytest.raises(FaultWordError) as info:
        list(drv.run(4))
    assert info.value.code == FAULT_POSITION_RANGE
    assert "position out of range" in str(info.value)


def test_sticky_fault_surfaces_through_stream_query():
    dev, drv = driver_for(FakeScript(sticky_fault_at=1), query_every=8, max_spins=100_000)
    with pytest.raises(ContextLostError, match="illegal memory access"):
        list(drv.run(4))


def test_lost_launch_is_detected_as_idle_but_short():
    dev, drv = driver_for(FakeScript(lost_steps=frozenset({1})), query_every=8, max_spins=100_000)
    with pytest.raises(ShortBurstError, match="3 of 4"):
        list(drv.run(4))


def test_short_burst_explained_by_a_stop_id_is_not_a_fault():
    stop = expected_tokens(2)[1]
    dev, drv = driver_for(stop_ids=(stop,), query_every=8)
    assert list(drv.run(6)) == expected_tokens(2)


def test_tokens_after_a_stop_id_are_not_published():
    stop = expected_tokens(3)[2]
    dev, drv = driver_for(stop_ids=(stop,))
    list(drv.run(8))
    while not dev.stream_query():
        pass
    assert dev.ring == expected_tokens(3)


def test_stop_of_an_earlier_burst_does_not_end_the_next_one():
    toks = expected_tokens(6)
    dev, drv = driver_for(stop_ids=(toks[1],))
    assert list(drv.run(4)) == toks[:2]
    # The sequence continues past the stop (the caller decided to): a new burst id.
    assert list(drv.run(2)) == toks[2:4]


def test_hang_trips_max_spins():
    dev, drv = driver_for(FakeScript(hang_at=2), max_spins=5_000, query_every=100)
    got = []
    with pytest.raises(HangError, match="5000 polls"):
        for tok in drv.run(4):
            got.append(tok)
    assert got == expected_tokens(2)


def test_begin_sequence_waits_for_the_tail_of_a_stopped_burst():
    toks = expected_tokens(2)
    dev, drv = driver_for(FakeScript(latency=4), stop_ids=(toks[0],))
    assert list(drv.run(8)) == toks[:1]
    assert dev.queue  # the no-op tail of the burst is still in flight
    drv.host_waits = 0
    drv.begin_sequence(SequenceStart(loop=True))
    assert drv.host_waits == 1 and not dev.queue and drv.published == 0


def test_begin_sequence_gives_the_device_its_sampling_parameters():
    dev, drv = driver_for()
    sampled = Sampling(temperature=0.8, top_p=0.9, seed=5)
    drv.begin_sequence(SequenceStart(loop=True, sampling=sampled))
    assert dev.sampler is not None and dev.sampler.params == sampled
    drv.begin_sequence(SequenceStart(loop=True))
    assert dev.sampler is None


def test_burst_needs_at_least_one_step():
    dev, drv = driver_for()
    with pytest.raises(ValueError):
        list(drv.run(0))


# --- Tokens published before a fault reach the caller, in order, before the error -------------


def test_tokens_visible_in_the_same_poll_as_the_fault_word_are_yielded_first():
    # Every operation completes at the first poll: it shows two new tokens and the fault at once.
    dev, drv = driver_for(FakeScript(latency=1, ops_per_tick=64, fault_word_at=2))
    got = []
    with pytest.raises(FaultWordError) as info:
        for tok in drv.run(4):
            got.append(tok)
    assert got == expected_tokens(2)
    assert info.value.position == 3


@pytest.mark.parametrize("script, error, message", [
    ({"nan_at_position": 3}, NonFiniteLogitsError, "position 3 gave non-finite logits"),
    ({"flat_at_position": 3}, DegenerateLogitsError, "position 3 gave degenerate logits"),
], ids=["non-finite", "degenerate"])
def test_bad_logits_raise_after_the_tokens_before_them_without_falling_back(script, error, message):
    dev, drv = driver_for(FakeScript(latency=1, ops_per_tick=64, **script))
    got = []
    with pytest.raises(error, match=message) as info:
        for tok in drv.run(6):
            got.append(tok)
    assert got == expected_tokens(3)
    assert not isinstance(info.value, FaultWordError) and info.value.position == 3


class RingThenSticky:
    """Just enough DeviceOps for one burst: the ring shows nothing until the driver queries the
    stream; the query publishes two tokens and then reports a sticky fault."""

    def __init__(self):
        self.published = 0
        self.queried = False

    def enqueue_step(self, burst_id):
        pass

    def poll_ring(self):
        return RingState(self.published)

    def read_ring(self, first, count):
        return [100 + i for i in range(first, first + count)]

    def stream_query(self):
        self.published = 2
        raise ContextLostError("device fault: cudaErrorIllegalAddress")


def test_tokens_that_land_before_a_sticky_fault_are_yielded_before_it():
    drv = BurstDriver(RingThenSticky(), query_every=1)
    got = []
    with pytest.raises(ContextLostError):
        for tok in drv.run(4):
            got.append(tok)
    assert got == [100, 101]


def test_tokens_that_land_before_a_hang_is_declared_are_yielded_before_it():
    class LateRing(RingThenSticky):
        def stream_query(self):
            return False

        def poll_ring(self):
            state = RingState(self.published)
            self.published = 1  # lands right after the poll that saw nothing
            return state

    dev = LateRing()
    drv = BurstDriver(dev, max_spins=1, query_every=1000)
    dev.published = 0
    got = []
    with pytest.raises(HangError):
        for tok in drv.run(2):
            got.append(tok)
    assert got == [100]
