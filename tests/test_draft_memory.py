"""The drafts' memory of earlier sequences, CPU tier: its definition (arcpy.drafting.draft with a
memory), the incremental index that mirrors it, the bounded store, and the engine remembering
answers so that a question asked again drafts its earlier answer, against FakeDevice."""

import random

import pytest

from arcpy.codes import DRAFT_MEMORY
from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.devices.sequence import SequenceStart
from arcpy.drafting import SEPARATOR, Acceptance, DraftMemory, NgramIndex, draft
from arcpy.errors import InvalidArgumentError
from arcpy.loop.engine import Engine
from arcpy.loop.gate import FallbackLatch
from arcpy.loop.settings import EngineSettings
from arcpy.loop.speculate import StepCost

S = SEPARATOR


# --- the definition ------------------------------------------------------------------------------

def test_a_question_asked_again_drafts_its_earlier_answer():
    memory = [7, 8, 9, 20, 21, 22, 23, S]  # prompt tail 7 8 9, answer 20..23
    assert draft([1, 7, 8, 9], 3, 3, memory) == [20, 21, 22]
    assert draft([1, 7, 8, 9, 20, 21], 7, 3, memory) == [22, 23]  # a remembered answer's end ends the drafts
    assert draft([1, 7, 8, 9], 3, 3) == []  # without the memory nothing repeats


def test_the_sequence_beats_an_equally_long_match_in_the_memory_but_not_a_longer_one():
    memory = [5, 6, 40, S, 4, 6, 50, S]
    assert draft([6, 60, 3, 6], 1, 1, memory) == [60]  # [6] in the sequence is later
    assert draft([6, 60, 3, 5, 6], 1, 2, memory) == [40]  # [5, 6] only in the memory: longer wins
    assert draft([1, 6], 1, 2, memory) == [50]  # among the memory's, the latest


def test_a_match_never_spans_a_separator():
    memory = [1, 2, S, 3, 9, S]
    # [2, 3] would span the first separator: only [3] matches, at 3, then 9
    assert draft([2, 3], 2, 2, memory) == [9]
    # the sequence's start is not joined to the memory's end either
    assert draft([4, 4], 1, 3, [4, S]) == [4]  # [4] ends at the sequence's 0 (later) and drafts on from it
    assert draft([9], 2, 3, [5, 9, S]) == []  # a match at a remembered sequence's last token drafts nothing


@pytest.mark.parametrize("seed", range(8))
def test_the_incremental_index_with_a_memory_drafts_exactly_as_the_definition(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([3, 5, 40])
    ngram, k = rng.choice([1, 2, 3, 8]), rng.choice([1, 4, 7])
    memory = []
    for _ in range(rng.randrange(0, 5)):
        memory += [rng.randrange(alphabet) for _ in range(rng.randrange(1, 30))] + [S]
    index = NgramIndex(ngram, memory=memory)
    history = []
    for _ in range(200):
        tok = rng.randrange(alphabet)
        history.append(tok)
        index.append(tok)
        assert index.draft(k) == draft(history, k, ngram, memory)


def test_acceptance_counts_steps_whose_drafts_run_out_at_a_separator():
    est = Acceptance(k=4, ngram=2, prompt=[3, 7], weight=1.0, memory=[3, 7, 1, 2, S])
    assert est._draft == [1, 2]
    est.push(1)
    est.push(2)
    est.push(5)  # both drafts accepted, then the model's own token: a step of 3
    assert (est.steps, est.tokens_per_step) == (1, 3.0)


# --- the store -----------------------------------------------------------------------------------

def test_the_memory_keeps_each_answer_after_its_prompt_tail_in_order():
    mem = DraftMemory(capacity=100, context=2)
    mem.remember([1, 2, 3, 4], [10, 11])
    mem.remember([5], [12])
    assert mem.layout() == [3, 4, 10, 11, S, 5, 12, S]
    mem.remember([1, 2, 3, 4], [10, 11])  # remembered again: now the newest, once
    assert mem.layout() == [5, 12, S, 3, 4, 10, 11, S]
    mem.remember([6], [])  # no answer: nothing to draft from
    assert mem.size == len(mem.layout()) == 8


def test_the_memory_drops_the_oldest_to_stay_within_its_capacity():
    mem = DraftMemory(capacity=10, context=1)
    mem.remember([1], [2, 3])       # 4 ids with its separator
    mem.remember([4], [5, 6])       # 8
    mem.remember([7], [8, 9, 10])   # 13 > 10: the first goes
    assert mem.layout() == [4, 5, 6, S, 7, 8, 9, 10, S]
    mem.remember([0], list(range(20, 40)))  # longer than the store: its last 9 ids, alone
    assert mem.layout() == [*range(31, 40), S]
    assert len(mem.layout()) <= 10


def test_the_default_memory_fits_the_device_store():
    mem = DraftMemory()
    mem.remember([1], list(range(3, DRAFT_MEMORY + 100)))
    assert len(mem.layout()) == DRAFT_MEMORY and mem.layout()[-1] == S


# --- the engine ----------------------------------------------------------------------------------

def scramble(tok, pos):
    """A model whose answer does not repeat itself within a sequence, and is the same every time."""
    return (tok * 37 + pos * pos * 11 + 5) % 997


def make_engine(**kw):
    script = FakeScript(next_token=scramble, speculate_k=4, vocab=1000)
    return Engine(FakeDevice(script), "fake", EngineSettings(device_loop=True, burst=8, **kw), environ={},
                  latch=FallbackLatch(), step_cost=StepCost(measure=False))


def test_a_question_asked_again_speculates_on_its_remembered_answer_with_the_same_tokens():
    eng = make_engine()
    prompt = [3, 14, 15, 92, 65]
    first = list(eng.generate(prompt, 64))
    assert eng.stats.spec_steps == 0  # nothing to draft from: the plain loop
    second = list(eng.generate(prompt, 64))
    assert second == first
    assert eng.stats.spec_steps > 0 and eng.stats.tokens_per_step > 4.0  # k = 4: nearly every draft
    assert eng.device.memory == tuple(eng.memory.layout())
    assert eng.device.drafts[0] == first[8:12]  # the first speculative step, after the plain burst


def test_without_the_memory_a_question_asked_again_runs_as_the_first_time():
    eng = make_engine(draft_memory=False)
    prompt = [3, 14, 15, 92, 65]
    first = list(eng.generate(prompt, 64))
    second = list(eng.generate(prompt, 64))
    assert second == first and eng.stats.spec_steps == 0 and eng.device.memory == ()


def test_a_different_question_leaves_its_tokens_unchanged_by_the_memory():
    eng = make_engine()
    list(eng.generate([3, 14, 15, 92, 65], 64))
    other = list(eng.generate([2, 71, 82, 81, 65], 48))  # the same last token, another answer
    fresh = make_engine(draft_memory=False)
    assert other == list(fresh.generate([2, 71, 82, 81, 65], 48))


def test_the_fake_refuses_a_malformed_memory_changing_nothing():
    dev = FakeDevice(FakeScript(speculate_k=2))
    for layout in ([1, 2], [0] * (DRAFT_MEMORY + 1) + [S]):
        with pytest.raises(InvalidArgumentError):
            dev.begin_sequence(SequenceStart(draft_memory=tuple(layout)))
    assert not dev.queue and dev.memory == ()
    with pytest.raises(InvalidArgumentError):
        FakeDevice(FakeScript()).begin_sequence(SequenceStart(draft_memory=(1, S)))  # no speculative step
