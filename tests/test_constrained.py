"""Constrained answers (arcpy.text.grammar, arcpy.loop.constrain): every answer under a JSON schema
parses and validates (1,000 sampled answers, jsonschema the judge), a required or named tool call
is a call in the model's format whose arguments validate, the grammar's bytes are the tokens'
own, and what the engine does with a mask.

Most answers come from the Typist (agent_helpers) told to write "Hello there.": the mask forbids
that from the first token, so each answer is a draw over what the grammar allows, every allowed
token as likely: a harsher test of the grammar than a model's preferences. A few come from the
Qwen3 fixture's random weights through the NumPy reference forward."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from agent_helpers import QWEN3, family_text, typist_engine
from llamacpp_sdist import llamacpp_models

from arcpy import load_checkpoint
from arcpy.backends import open_engine
from arcpy.errors import InvalidArgumentError, NonFiniteLogitsError
from arcpy.loop.constrain import Constrained, vocabulary
from arcpy.loop.request import Request
from arcpy.model.gguf_file import read_gguf
from arcpy.model.gguf_vocab import read_vocabulary
from arcpy.sampling import Sampling
from arcpy.text import encode, gguf_text_spec
from arcpy.text.answer import split
from arcpy.text.grammar import GBNF, JSON_OBJECT, JSON_SCHEMA, Grammar, allowed, token_bytes, words
from arcpy.text.tools import HERMES, JSON, MISTRAL

SCHEMAS = [
    {"type": "object", "additionalProperties": False, "required": ["name", "age"],
     "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0,
                                                                           "maximum": 130}}},
    {"type": "object", "additionalProperties": False, "required": ["city", "days"],
     "properties": {"city": {"enum": ["Oslo", "Paris", "Lima"]},
                    "days": {"type": "array", "maxItems": 3, "items": {
                        "type": "object", "additionalProperties": False, "required": ["high", "sky"],
                        "properties": {"high": {"type": "number", "minimum": -60, "maximum": 60},
                                       "sky": {"enum": ["clear", "rain"]}}}}}},
    {"type": "array", "minItems": 1, "maxItems": 4, "items": {"type": "boolean"}},
    {"type": "object", "additionalProperties": False, "required": ["ok"],
     "properties": {"ok": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 6},
                    "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}},
]
HELLO = "Hello there."


def fmt(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def ask(engine, seed: int, **kw) -> tuple[str, str]:
    r = Request(messages=[{"role": "user", "content": "Hi"}], max_new_tokens=400,
                sampling=Sampling(temperature=1.0, seed=seed), **kw)
    text = "".join(engine.chat(r))
    return text, engine.stats.finish_reason


def test_a_thousand_sampled_answers_all_parse_and_validate():
    engine = typist_engine(family_text(), lambda prompt: HELLO)
    count = 0
    for i in range(1000):
        schema = SCHEMAS[i % len(SCHEMAS)]
        text, reason = ask(engine, i, response_format=fmt(schema))
        assert reason == "stop_id", (i, text)  # the grammar ended it, within the budget
        jsonschema.validate(json.loads(text), schema)
        count += 1
    assert count == 1000
    assert engine.stats.path == "host" and engine.stats.host_waits >= engine.stats.tokens


def test_answers_of_a_real_forward_validate_too():
    model, text = load_checkpoint(QWEN3)
    with open_engine(model, "numpy", text=text, max_seq=256) as engine:
        for i in range(12):
            schema = SCHEMAS[i % len(SCHEMAS)]
            out, reason = ask(engine, i, response_format=fmt(schema))
            assert reason == "stop_id"
            jsonschema.validate(json.loads(out), schema)


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city"],
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1,
                                                                          "maximum": 7}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "additionalProperties": False, "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}
TEMPLATES = {HERMES: "{{ '<tool_call>' }}{% for m in messages %}{{ m.content }}{% endfor %}",
             JSON: "{% for m in messages %}{{ m.content }}{% endfor %}",
             MISTRAL: "{{ '[TOOL_CALLS]' }}{% for m in messages %}{{ m.content }}{% endfor %}"}


@pytest.mark.parametrize("form", [HERMES, JSON, MISTRAL])
@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_a_required_or_named_call_is_a_valid_call_in_the_models_format(form, choice):
    engine = typist_engine(family_text(TEMPLATES[form]), lambda prompt: HELLO)
    tools = {"get_weather": WEATHER, "get_time": TIME}
    for seed in range(40):
        text, reason = ask(engine, seed, tools=[WEATHER, TIME], tool_choice=choice)
        assert reason == "stop_id", text
        answer = split(text, tools=form)
        assert answer.tool_calls and not answer.content.strip(), text
        for call in answer.tool_calls:
            name = call["function"]["name"]
            assert name == choice or choice == "required"
            jsonschema.validate(json.loads(call["function"]["arguments"]), tools[name]["function"]["parameters"])


def test_the_grammars_bytes_are_the_tokens_own():
    """token_bytes against the tokenizer: the bytes of an encoded text's ids are the text's bytes,
    for byte-level BPE (Llama 3's 128k vocabulary) and SentencePiece (Llama 2's)."""
    sample = "Héllo, wörld! 1234 <tag> 日本語 \n\t end"
    for name in ("ggml-vocab-llama-bpe.gguf", "ggml-vocab-llama-spm.gguf"):
        f = read_gguf(llamacpp_models() / name)
        n = len(f.meta.strings("tokenizer.ggml.tokens"))
        spec = gguf_text_spec(read_vocabulary(f.meta, n))
        pieces = token_bytes(spec, n)
        ids = encode(spec, sample, add_bos=False)
        joined = b"".join(pieces[i] for i in ids)
        assert joined.decode() in (sample, " " + sample), name  # SentencePiece leads with its space
        assert all(pieces[i] == b"" for i in spec.eos_ids), name


def test_the_mask_allows_the_end_only_where_the_answer_is_whole():
    spec = family_text()
    grammar = Grammar.compile(vocabulary(spec, 288), JSON_SCHEMA, SCHEMAS[0])
    m = grammar.matcher()
    bits = np.zeros(words(288), np.int32)
    eos = spec.eos_ids[0]
    for tok in encode(spec, '{"name": "Al", "age": 7', add_bos=False):
        m.fill(bits)
        ok = allowed(bits, 288)
        assert ok[tok] and not ok[eos]
        m.consume(tok)
    m.fill(bits)
    assert not allowed(bits, 288)[eos]  # "7" may go on: "79"
    m.consume(encode(spec, "}", add_bos=False)[0])
    m.fill(bits)
    assert np.flatnonzero(allowed(bits, 288)).tolist() == [eos]
    with pytest.raises(InvalidArgumentError, match="not allowed"):
        m.consume(encode(spec, "x", add_bos=False)[0])


@pytest.mark.parametrize("kind, source, words_", [
    (JSON_SCHEMA, {"type": "objekt"}, "not valid"),
    (JSON_SCHEMA, {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}, "not valid"),
    (JSON_SCHEMA, [1], "must be an object"),
    (GBNF, "root ::= ((", "GBNF"),
    (GBNF, "", "non-empty"),
    ("yaml", None, "unknown grammar kind"),
])
def test_a_bad_schema_or_grammar_is_one_line_with_the_reason(kind, source, words_):
    with pytest.raises(InvalidArgumentError, match=words_) as e:
        Grammar.compile(vocabulary(family_text(), 288), kind, source)
    assert "\n" not in str(e.value).strip()


def test_a_gbnf_grammar_and_any_json_object():
    engine = typist_engine(family_text(), lambda prompt: HELLO)
    for seed in range(20):
        text, _ = ask(engine, seed, response_format={"type": "grammar", "grammar": 'root ::= "a" [0-9]{1,3} "."'})
        assert text[0] == "a" and text[-1] == "." and text[1:-1].isdigit()
    engine = typist_engine(family_text(), lambda prompt: '{"x": [1, {"y": null}]}')
    text, _ = ask(engine, 0, response_format={"type": JSON_OBJECT})
    assert json.loads(text) == {"x": [1, {"y": None}]}  # the model's own answer, where the grammar allows it


def test_a_nan_is_not_hidden_by_the_mask():
    spec = family_text()
    c = Constrained(Grammar.compile(vocabulary(spec, 288), JSON_OBJECT).matcher(), 288)
    c.fill()
    logits = np.arange(300, dtype=np.float32)  # a padded head: only the first 288 are ids
    ok = np.flatnonzero(allowed(c.mask, 288))
    assert 5 not in ok  # id 5 is forbidden at the first position: its NaN below must still be caught
    assert 0 < len(ok) < 288 and c.masked(logits).tolist() == ok.tolist()  # the allowed ids' own logits
    assert c.consume(len(ok) - 1) == ok[-1]  # an index of them is its token id
    engine = typist_engine(spec, lambda prompt: HELLO)
    engine.device.logits_hook = None
    original = engine.device._logits_at
    # A NaN at an id the mask forbids.
    engine.device._logits_at = lambda p: np.where(np.arange(288) == 5, np.nan, original(p)).astype(np.float32)
    with pytest.raises(NonFiniteLogitsError):
        ask(engine, 0, response_format={"type": JSON_OBJECT})


def test_mistrals_tool_calls_token_is_forced_as_the_token_and_read_back_by_id():
    from tokenizers import AddedToken

    from arcpy.text.answer import Splitter, special_marks

    spec = family_text(TEMPLATES[MISTRAL])
    spec.tokenizer.add_special_tokens([AddedToken("[TOOL_CALLS]", special=True)])
    marker = spec.tokenizer.token_to_id("[TOOL_CALLS]")
    assert marker == 288 and special_marks(spec) == {marker: "[TOOL_CALLS]"}
    engine = typist_engine(spec, lambda prompt: HELLO)
    for seed in range(10):
        r = Request(messages=[{"role": "user", "content": "Hi"}], max_new_tokens=400, tools=[WEATHER, TIME],
                    tool_choice="get_weather", sampling=Sampling(temperature=1.0, seed=seed))
        pieces = list(engine.stream(r))
        assert pieces[0].token == marker  # the token itself, not its characters
        s = Splitter(tools=MISTRAL, marks=special_marks(spec))
        for p in pieces:
            s.push(p.text, p.token)
        s.finish()
        (call,) = s.answer.tool_calls
        assert call["function"]["name"] == "get_weather" and s.answer.content == ""
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])
