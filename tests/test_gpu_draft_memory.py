"""GPU tier: the drafts' memory of earlier sequences (ARC_SEQ_DRAFT_MEMORY of arc_loop_begin_sequence; marker `gpu`).

- The draft kernel's drafts against arcpy.drafting.draft with the same history and memory: drafts
  from the memory, cut short by a separator, the sequence's own match winning a tie, an emptied
  memory, and a memory filled to the store's limit.
- The engine: a question asked again speculates on its remembered answer and gives the plain
  loop's tokens, on a bf16 and a quantized model.
"""

import numpy as np
import pytest

from arcpy import _lib
from arcpy.codes import DRAFT_MEMORY
from arcpy.devices.context import sequence_struct
from arcpy.devices.cuda import open_cuda_device
from arcpy.devices.sequence import SequenceStart
from arcpy.drafting import SEPARATOR as S
from arcpy.drafting import draft
from arcpy.errors import InvalidArgumentError
from arcpy.loop.burst import BurstDriver
from arcpy.loop.engine import DEVICE_LOOP, Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.loop.speculate import StepCost
from arcpy.model import synthetic_model

pytestmark = pytest.mark.gpu
K = 7


@pytest.fixture(scope="module", params=["stories15M", "tiny-quant"])
def device(request):
    dev = open_cuda_device(synthetic_model(request.param, seed=5), max_seq=512, speculate=K)
    yield dev
    dev.close()


def one_step(device, prompt, layout):
    """One speculative step at the prompt's last position (the rest prefilled), with `layout` as
    the memory: the drafts the device wrote. The history it drafts from is the prompt."""
    ctx, lib, ffi = device.ctx, device.lib, device.ffi
    drv = BurstDriver(device, max_spins=50_000_000)
    drv.begin_sequence(SequenceStart(loop=True, draft_memory=tuple(layout)))
    device.enqueue_prefill(prompt[:-1], 0)
    device.set_input(prompt[-1], len(prompt) - 1)
    list(drv.run_speculative(1, 1000))
    ctx.wait_idle()
    lp, tp, rp = ffi.new("const float **"), ffi.new("const int32_t **"), ffi.new("int32_t *")
    _lib.check(lib.arc_model_speculation(device.forward.ptr, lp, tp, rp))
    tokens, _ = ctx.pinned((K + 2,), np.int32)
    ctx.download_async(tokens, tp[0])
    ctx.wait_idle()
    return tokens[1:1 + int(tokens[K + 1])].tolist()


def test_the_device_drafts_from_its_memory_as_the_definition_does(device):
    rng = np.random.default_rng(11)
    prompt = rng.integers(3, device.vocab, 24).tolist()
    answer = rng.integers(3, device.vocab, 12).tolist()
    other = rng.integers(3, device.vocab, 30).tolist()
    tail = prompt[-4:]
    cases = {
        "the answer remembered": (prompt, [*other, S, *tail, *answer, S], answer[:K]),
        "cut short by its end": (prompt, [*tail, *answer[:3], S, *other, S], answer[:3]),
        "a longer match earlier": (prompt, [*tail, *answer, S, *tail[-2:], *other, S], answer[:K]),
        "the latest of equal ones": (prompt, [*tail, *other, S, *tail, *answer, S], answer[:K]),
        "the sequence's own wins a tie": ([*prompt[:5], 9, 17, *answer, 9, 17], [9, 17, *other, S],
                                          [*answer[:K]]),
        "no match across a separator": (prompt, [*tail[:2], S, *tail[2:], S], []),
        "emptied": (prompt, [], []),
        "the store full": (prompt, [*rng.integers(3, device.vocab, DRAFT_MEMORY - 20).tolist(), S,
                                    *tail, *answer[:6], S], answer[:6]),
    }
    ngram = device.speculate_ngram
    for name, (history, layout, expected) in cases.items():
        assert len(layout) <= DRAFT_MEMORY
        got = one_step(device, history, layout)
        want = draft(history, K, ngram, layout)
        assert want == expected, f"{name}: the definition drafts {want}"
        assert got == want, f"{name}: the device drafted {got}, the definition {want}"


def test_a_malformed_memory_is_refused_and_changes_nothing(device):
    prompt = list(range(3, 27))
    kept = [*prompt[-3:], 99, 98, S]
    device.begin_sequence(SequenceStart(draft_memory=tuple(kept)))
    for layout in ([1, 2, 3], [0] * DRAFT_MEMORY + [S]):
        with pytest.raises(InvalidArgumentError):
            device.begin_sequence(SequenceStart(draft_memory=tuple(layout)))
    seq, _keep = sequence_struct(device.ffi, device.lib, memory=(device.ffi.NULL, DRAFT_MEMORY))
    status = device.lib.arc_loop_begin_sequence(device.loop, seq)
    assert status != 0
    # the memory the device holds is still `kept` (a sequence's start sends only a changed one)
    device._memory_sent = None
    assert one_step(device, prompt, kept) == [99, 98] == draft(prompt, K, device.speculate_ngram, kept)


def test_a_question_asked_again_speculates_on_its_answer_with_the_plain_loops_tokens(device):
    prompt = np.random.default_rng(2).integers(3, device.vocab, 40).tolist()
    plain = Engine(device, "cuda", EngineSettings(device_loop=True, burst=8, speculate=False), environ={},
                   latch=FallbackLatch())
    want = list(plain.generate(prompt, 120))
    eng = Engine(device, "cuda", EngineSettings(device_loop=True, burst=8), environ={}, latch=FallbackLatch(),
                 step_cost=StepCost(measure=False))
    first = list(eng.generate(prompt, 120))
    again = list(eng.generate(prompt, 120))
    assert first == want and again == want
    st = eng.stats
    assert st.path == DEVICE_LOOP and st.spec_steps > 0 and st.tokens_per_step > 4.0, st.summary()
