"""GPU tier: constrained output in the device loop (marker `gpu`; libarc/mask.cu). A stories15M
shape with the Qwen3 fixture's 288-token vocabulary answers under a JSON schema: every step waits
on the device for the mask the host writes once the token before has landed, so the answer costs
no host wait a token, parses, and is the host path's answer token for token, greedy and seeded
(the host path draws from the allowed ids alone; the loop's -inf elsewhere gives the same draw). A
mask that never comes latches ARC_FAULT_MASK_TIMEOUT after ARC_MASK_WAIT_US, and a step whose
commit would publish nothing does not wait."""

from __future__ import annotations

import dataclasses
import json
import time

import jsonschema
import pytest
from agent_helpers import family_text

from arcpy.codes import FAULT_MASK_TIMEOUT
from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.sequence import SequenceStart
from arcpy.errors import FaultWordError
from arcpy.loop.burst import BurstDriver
from arcpy.loop.engine import DEVICE_LOOP, HOST, Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.request import Constraint, Request
from arcpy.loop.settings import EngineSettings
from arcpy.model import SHAPES, random_model
from arcpy.sampling import Sampling

pytestmark = pytest.mark.gpu
TEXT = family_text()
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 16},
                         "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}, "maxItems": 5}}}
FORMAT = Constraint.of({"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA, "strict": True}})


@pytest.fixture(scope="module")
def device():
    cfg = dataclasses.replace(SHAPES["stories15M"], vocab=TEXT.tokenizer.get_vocab_size(), max_seq=1024)
    dev = open_cuda_device(random_model(cfg, seed=4), max_seq=1024)
    yield dev
    dev.close()


def answer(device, loop: bool, sampling: Sampling, burst: int = 8):
    eng = Engine(device, "cuda", EngineSettings(device_loop=loop, burst=burst, speculate=False), environ={},
                 latch=FallbackLatch())
    eng.text = TEXT
    r = Request(messages=[{"role": "user", "content": "name and tags"}], max_new_tokens=200, response_format=FORMAT,
                sampling=sampling)
    tokens, text = [], []
    for piece in eng.stream(r):
        if piece.token is not None:
            tokens.append(piece.token)
        text.append(piece.text or "")
    return eng.stats, tokens, "".join(text)


@pytest.mark.parametrize("burst", [1, 8])
@pytest.mark.parametrize("seed", [None, 1, 2, 3, 4, 5])
def test_gpu_constrained_answers_in_the_loop_are_the_host_paths(device, seed, burst):
    sampling = Sampling() if seed is None else Sampling(temperature=1.0, top_p=0.95, seed=seed)
    st, tokens, text = answer(device, True, sampling, burst)
    assert st.path == DEVICE_LOOP and st.host_waits == 0
    host_st, host_tokens, host_text = answer(device, False, sampling)
    assert host_st.path == HOST and tokens == host_tokens and text == host_text
    if st.finish_reason == "stop_id":
        jsonschema.validate(json.loads(text), SCHEMA)


def test_gpu_a_mask_that_never_comes_latches_the_timeout(device):
    drv = BurstDriver(device)
    drv.begin_sequence(SequenceStart(loop=True, masked=True))  # and no mask written
    device.set_input(1, 0)
    t0 = time.perf_counter()
    with pytest.raises(FaultWordError) as info:
        list(drv.run(2))
    waited = time.perf_counter() - t0
    assert info.value.code == FAULT_MASK_TIMEOUT and 1.5 < waited < 3.5, waited  # the second step did not wait
    drv.begin_sequence(SequenceStart(loop=True))  # the ring resets, unmasked; the next sequence decodes
    device.set_input(1, 0)
    assert len(list(drv.run(4))) == 4
