"""The one request type: what it accepts, what it refuses (one line each), and the engine taking it."""

import pytest

from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.errors import InvalidArgumentError
from arcpy.loop.engine import Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.request import Message, Request
from arcpy.loop.settings import EngineSettings
from arcpy.sampling import Sampling


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one of prompt, prompt_ids and messages, got none"),
    ({"prompt": "a", "prompt_ids": [1]}, "got prompt, prompt_ids"),
    ({"prompt_ids": []}, "prompt_ids is empty"),
    ({"prompt_ids": [1, -2]}, "a token id must be an integer >= 0, got -2"),
    ({"prompt_ids": "12"}, "prompt_ids must be a list of token ids"),
    ({"prompt_ids": [True]}, "a token id must be an integer >= 0"),
    ({"messages": []}, "messages is empty"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "unknown message role 'robot'"),
    ({"messages": [{"role": "user", "content": 3}]}, "content must be a string"),
    ({"messages": [{"role": "user", "content": "hi", "weight": "x"}]}, "unsupported key 'weight'"),
    ({"messages": ["hi"]}, "messages[0] must be a dict"),
    ({"prompt": "hi", "stop": [""]}, "a stop string must be a non-empty string"),
    ({"prompt": "hi", "stop_ids": [1.5]}, "a token id must be an integer"),
    ({"prompt": "hi", "max_new_tokens": -1}, "max_new_tokens must be an integer >= 0"),
    ({"prompt": "hi", "sampling": {"temperature": 1}}, "sampling must be an arcpy.sampling.Sampling"),
    ({"prompt": "caf\udce9"}, "the prompt is not valid UTF-8: character 3"),
])
def test_a_bad_request_is_one_clear_error(kwargs, message):
    with pytest.raises(InvalidArgumentError) as err:
        Request(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_request_normalizes_what_it_holds():
    r = Request(messages=[{"role": "user", "content": "hi"}], stop=".", stop_ids=[3, 4],
                sampling=Sampling(0.5, seed=1))
    assert r.messages == (Message("user", "hi"),) and r.stop == (".",) and r.stop_ids == (3, 4)
    assert r.is_text and not Request(prompt_ids=[1]).is_text
    assert hash(Request(prompt_ids=[1, 2])) == hash(Request(prompt_ids=(1, 2)))


def test_engine_generate_takes_a_request_as_it_takes_ids():
    latch = FallbackLatch()
    eng = Engine(FakeDevice(FakeScript()), "fake", EngineSettings(device_loop=True), environ={}, latch=latch)
    by_ids = list(eng.generate([5, 6], 12, sampling=Sampling(0.9, seed=4)))
    by_request = list(eng.generate(Request(prompt_ids=[5, 6], max_new_tokens=12, sampling=Sampling(0.9, seed=4))))
    assert by_request == by_ids and len(by_ids) == 12


def test_engine_chat_refuses_an_unknown_role_before_anything_runs():
    eng = Engine(FakeDevice(FakeScript()), "fake", environ={}, latch=FallbackLatch())
    with pytest.raises(InvalidArgumentError, match="unknown message role 'wizard'"):
        list(eng.chat([{"role": "wizard", "content": "hi"}]))
    assert eng.seq is None
