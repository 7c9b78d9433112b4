"""EngineSettings (arcpy/loop/settings.py): its defaults, its checks, and the engine and
open_engine (arcpy/backends.py) taking it."""

import pytest

from arcpy.backends import open_engine
from arcpy.codes import MAX_BURST
from arcpy.devices.fake import FakeDevice
from arcpy.errors import InvalidArgumentError
from arcpy.loop.burst import MAX_SPINS
from arcpy.loop.engine import Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import SETTING_NAMES, EngineSettings
from arcpy.model import synthetic_model


@pytest.mark.parametrize("burst", [0, MAX_BURST + 1, 2.0, "4", None])
def test_a_burst_outside_its_range_is_refused_in_one_line(burst):
    with pytest.raises(InvalidArgumentError, match=rf"^burst must be an integer in 1\.\.{MAX_BURST}, got {burst!r}$"):
        EngineSettings(burst=burst)


def test_an_engine_without_settings_takes_the_defaults():
    eng = Engine(FakeDevice(), "fake", environ={}, latch=FallbackLatch())
    assert eng.settings == EngineSettings()
    assert (eng.burst, eng.device_loop, eng.verify, eng.max_spins) == (4, None, False, MAX_SPINS)
    assert (eng.prefill, eng.speculate, eng.memory is not None) == (True, True, True)


def test_the_settings_are_one_frozen_record():
    settings = EngineSettings(burst=8, device_loop=True)
    with pytest.raises(AttributeError):
        settings.burst = 2
    assert SETTING_NAMES == {"device_loop", "burst", "verify", "max_spins", "prefill", "speculate", "prefix_cache",
                             "prompt_cache_bytes", "draft_memory"}


def test_open_engine_builds_the_settings_from_its_keywords_and_hands_the_collaborators_over():
    latch = FallbackLatch()
    with open_engine(synthetic_model("stories15M"), "numpy", max_seq=32, environ={}, latch=latch, burst=8,
                     prefix_cache=False, draft_memory=False) as engine:
        assert engine.settings == EngineSettings(burst=8, prefix_cache=False, draft_memory=False)
        assert engine.latch is latch and engine.environ == {}


def test_open_engine_refuses_a_keyword_it_does_not_know():
    with pytest.raises(TypeError, match="unexpected keyword arguments: bursts"):
        open_engine(synthetic_model("stories15M"), "numpy", max_seq=32, environ={}, bursts=8)
