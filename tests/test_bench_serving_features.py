"""The serving benchmark's rows (arcpy.bench.serving_features), on FakeDevice: the conversation's sizes,
the cached run against the cold one, and the log-probabilities row; the figures themselves come
from the GPU (scripts/bench.py --serving)."""

import pytest

from arcpy.bench import serving_features
from arcpy.devices.fake import FakeDevice, FakeScript
from arcpy.errors import InvalidArgumentError
from arcpy.model import SHAPES


def test_the_last_turns_history_is_the_asked_size():
    system, questions = serving_features.conversation(32000, 10, 4096)
    assert len(questions) == 10 and all(len(q) == serving_features.QUESTION for q in questions)
    assert len(system) + 9 * (serving_features.QUESTION + serving_features.ANSWER) + serving_features.QUESTION == 4096
    with pytest.raises(InvalidArgumentError, match="too short for 10 turns"):
        serving_features.conversation(32000, 10, 600)


def test_the_cached_run_reuses_each_turns_history_and_answers_as_the_cold_one():
    dev = FakeDevice(FakeScript(max_seq=2048, prefix_granule=16))
    row = serving_features.turns_row(dev, turns=4, history=800, runs=1)
    assert row["same_answers"] and len(row["ttft_ms_cached"]) == len(row["ttft_ms_cold"]) == 4
    # Every turn after the first finds the previous prompt, to the granule.
    assert 0.5 < row["hit_rate"] < 1.0
    assert row["last_turn_prompt_tokens"] == 800
    lines = serving_features.format_rows("fake", row, None)
    assert "turn 4 of a 800-token conversation" in lines[0] and "answers equal" in lines[0]


def test_a_history_past_the_context_is_refused():
    with pytest.raises(InvalidArgumentError, match="do not fit"):
        serving_features.turns_row(FakeDevice(FakeScript(max_seq=512)), turns=2, history=500, runs=1)


def test_the_logprobs_row_times_both_and_counts_no_host_waits():
    row = serving_features.logprobs_row(FakeDevice(FakeScript(max_seq=1024)), tokens=32, runs=2)
    assert row["host_waits_per_token_logprobs"] == 0 and row["us_plain"] > 0 and row["us_logprobs"] > 0
    assert "top_logprobs 5" in serving_features.format_rows("fake", None, row)[0]


def test_the_constrained_row_compares_schema_answers_with_free_ones_and_parses_them():
    from agent_helpers import family_text, typist_engine
    text = family_text()
    eng = typist_engine(text, lambda prompt: '{"name": "Golden Gate", "year": 1937, "tags": ["red"]}')
    row = serving_features.constrained_row(eng.device, text, seeds=2, tokens=64)
    assert row["ended"] == row["parsed"] == 2
    assert row["tok_s_schema"] > 0 and row["tok_s_free"] > 0 and row["path_schema"] == "host"
    assert "2 of 2 ended answers parse" in serving_features.format_rows("typist", None, None, row)[0]


def test_a_synthetic_shape_gets_the_context_its_conversation_needs():
    assert serving_features.synthetic_for("stories15M", 64).config.max_seq == SHAPES["stories15M"].max_seq
    model = serving_features.synthetic_for("stories15M", 4096)  # its preset holds fewer positions
    assert SHAPES["stories15M"].max_seq < 4096 + serving_features.ANSWER == model.config.max_seq
    with pytest.raises(InvalidArgumentError, match="unknown synthetic shape"):
        serving_features.synthetic_for("no-such-shape", 4096)
