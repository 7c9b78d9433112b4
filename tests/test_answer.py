"""The answer splitter (arcpy.text.answer): reasoning, content and tool calls, whole and streamed at
every split point, in every call format; and the tool helpers it uses (arcpy.text.tools)."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from arcpy.errors import InvalidArgumentError
from arcpy.text.answer import Delta, Splitter, opens_thinking, split
from arcpy.text.gemma4 import THOUGHT_CLOSE, THOUGHT_OPEN
from arcpy.text.tools import (
    GEMMA4,
    HARMONY,
    HERMES,
    JSON,
    MISTRAL,
    XML,
    check_tool_calls,
    check_tool_choice,
    check_tools,
    for_template,
    parse_calls,
    tool_format,
)


def ids():
    counter = itertools.count()
    return lambda fmt: f"id{next(counter)}"


def streamed(text: str, cuts, **kw):
    """The splitter fed `text` cut at `cuts`: (the answer it builds, the deltas reassembled)."""
    s = Splitter(ids=ids(), **kw)
    deltas, last = [], 0
    for c in list(cuts) + [len(text)]:
        deltas += s.push(text[last:c])
        last = c
    deltas += s.finish()
    return s.answer, reassemble(deltas)


def reassemble(deltas: list[Delta]) -> dict:
    """What a client builds from the deltas, as OpenAI's clients merge tool-call deltas by index."""
    out = {"reasoning": "", "content": "", "tool_calls": []}
    for d in deltas:
        out["reasoning"] += d.reasoning
        out["content"] += d.content
        if d.tool_call is not None:
            c = d.tool_call
            while len(out["tool_calls"]) <= c["index"]:
                out["tool_calls"].append({"id": "", "name": "", "arguments": ""})
            slot = out["tool_calls"][c["index"]]
            slot["id"] += c.get("id") or ""
            slot["name"] += c["function"].get("name") or ""
            slot["arguments"] += c["function"].get("arguments") or ""
    return out


def flat(answer) -> dict:
    return {"reasoning": answer.reasoning, "content": answer.content,
            "tool_calls": [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                           for c in answer.tool_calls]}


HARMONY_KW = {"harmony": True, "reasoning": True, "tools": HARMONY}
GEMMA4_KW = {"reasoning": True, "tools": GEMMA4, "tags": (THOUGHT_OPEN, THOUGHT_CLOSE)}
XML_KW = {"reasoning": True, "opened": True, "tools": XML,
          "params": {"get_weather": {"city": {"type": "string"}, "days": {"type": "integer"}}}}
XML_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis,\n{France}\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>")
CASES = [
    # (text, splitter options, reasoning, content, [(name, arguments)])
    ("<think>\nLet me see.\n</think>\n\nParis.", {"reasoning": True}, "\nLet me see.\n", "Paris.", []),
    ("  <think>a</think>b", {"reasoning": True}, "a", "b", []),
    ("No thoughts.", {"reasoning": True}, "", "No thoughts.", []),
    ("<thin", {"reasoning": True}, "", "<thin", []),
    ("<think>never closed", {"reasoning": True}, "never closed", "", []),
    ("step 1, step 2\n</think>\n\n42", {"reasoning": True, "opened": True}, "step 1, step 2\n", "42", []),
    ("a < b </thin k", {"reasoning": True, "opened": True}, "a < b </thin k", "", []),
    ("Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
     {"tools": HERMES}, "", "Sure.\n", [("get_weather", '{"city": "Paris"}')]),
    ("<think>need weather</think>\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
     {"tools": HERMES, "reasoning": True}, "need weather", "", [("a", "{}"), ("b", '{"x": [1, 2]}')]),
    ("<tool_call>not json</tool_call> after", {"tools": HERMES}, "", "<tool_call>not json</tool_call>after", []),
    ("x <tool_c", {"tools": HERMES}, "", "x <tool_c", []),
    ('{"name": "get_weather", "parameters": {"city": "Oslo"}}', {"tools": JSON}, "", "",
     [("get_weather", '{"city": "Oslo"}')]),
    ('<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"a": 1}}', {"tools": JSON}, "", "",
     [("f", "{}"), ("g", '{"a": 1}')]),
    ('{"not": "a call"}', {"tools": JSON}, "", '{"not": "a call"}', []),
    ("Hello {there}", {"tools": JSON}, "", "Hello {there}", []),
    ('[TOOL_CALLS][{"name": "f", "arguments": {"q": "x"}}, {"name": "g", "arguments": {}}]', {"tools": MISTRAL},
     "", "", [("f", '{"q": "x"}'), ("g", "{}")]),
    ('Let me check. [TOOL_CALLS]f[ARGS]{"q": 1}[TOOL_CALLS]g[ARGS]{}', {"tools": MISTRAL}, "", "Let me check. ",
     [("f", '{"q": 1}'), ("g", "{}")]),
    ("[TOOL_CALLS]oops", {"tools": MISTRAL}, "", "[TOOL_CALLS]oops", []),
    # harmony (gpt-oss): the answer starts after the prompt's <|start|>assistant
    ("<|channel|>analysis<|message|>Easy: Paris.<|end|><|start|>assistant<|channel|>final<|message|>Paris.<|return|>",
     HARMONY_KW, "Easy: Paris.", "Paris.", []),
    ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
     HARMONY_KW, "Need weather.", "", [("get_weather", '{"city": "Paris"}')]),
    (' to=functions.f<|channel|>commentary json<|message|>{"a": [1, 2]}', HARMONY_KW, "", "", [("f", '{"a": [1, 2]}')]),
    ("<|channel|>commentary<|message|>Checking two cities.<|end|><|start|>assistant to=functions.f<|channel|>"
     "commentary json<|message|>{}<|call|>", HARMONY_KW, "", "Checking two cities.", [("f", "{}")]),
    ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>not json", HARMONY_KW, "", "",
     [("f", "not json")]),
    ("<|channel|>final<|message|>a < b and <|en", HARMONY_KW, "", "a < b and <|en", []),
    ("<|channel|>analysis<|message|>first<|start|>assistant<|channel|>final<|message|>second", HARMONY_KW, "first",
     "second", []),
    ("<|channel|>analysis<|message|>thinking, cut off", HARMONY_KW, "thinking, cut off", "", []),
    ("<|channel|>analysis<|message|>done<|end|><|start|>assistant<|chan", HARMONY_KW, "done", "", []),
    ('{"name": "Ada"}', HARMONY_KW, "", '{"name": "Ada"}', []),
    ("<|chan", HARMONY_KW, "", "<|chan", []),
    ("<|char|>", HARMONY_KW, "", "<|char|>", []),
    ("<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>ok",
     {"harmony": True, "tools": HARMONY}, "", "hmok", []),
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary to=functions.f<|message|>{}",
     {"harmony": True, "reasoning": True}, "a", "{}", []),
    # Gemma 4
    ("<|channel>thought\nThe user wants weather.<channel|>Let me look.<|tool_call>call:get_weather{city:<|\"|>Paris, "
     "France<|\"|>,days:2}<tool_call|><|tool_call>call:get_time{zone:<|\"|>{CET}<|\"|>}<tool_call|>", GEMMA4_KW,
     "The user wants weather.", "Let me look.", [("get_weather", '{"city": "Paris, France", "days": 2}'),
                                                 ("get_time", '{"zone": "{CET}"}')]),
    ("Paris.", GEMMA4_KW, "", "Paris.", []),
    ("<|channel>thought\nhm<channel|>\n\nParis.", {**GEMMA4_KW, "tools": None}, "hm", "Paris.", []),
    ("before <|tool_call>call:f{a:}<tool_call|> after", GEMMA4_KW, "",
     "before <|tool_call>call:f{a:}<tool_call|>after", []),
    ("x <|tool_c", GEMMA4_KW, "", "x <|tool_c", []),
    # XML (Qwen3.5): the prompt opened <think>; values typed by the tools' schemas
    (f"The user wants weather.\n</think>\n\nLet me look.\n\n{XML_CALL}\n<tool_call>\n<function=get_time>\n"
     "<parameter=zone>\n[1, 2]\n</parameter>\n</function>\n</tool_call>", XML_KW, "The user wants weather.\n",
     "Let me look.\n\n", [("get_weather", '{"city": "Paris,\\n{France}", "days": 2}'),
                          ("get_time", '{"zone": "[1, 2]"}')]),
    ("\n</think>\n\nParis.", XML_KW, "\n", "Paris.", []),
    ("</think><tool_call>\n<function=get_weather>\n<parameter=days>\nmany\n</parameter>\n</function>\n</tool_call>",
     XML_KW, "", "", [("get_weather", '{"days": "many"}')]),
    ("</think>before <tool_call>\n<function=f>\n<parameter=a>\nx\n</function>\n</tool_call> after", XML_KW, "",
     "before <tool_call>\n<function=f>\n<parameter=a>\nx\n</function>\n</tool_call>after", []),
    (f"</think>{XML_CALL.replace('get_weather', 'x y')}", XML_KW, "", XML_CALL.replace("get_weather", "x y"), []),
    ("</think>x <tool_c", XML_KW, "", "x <tool_c", []),
]


@pytest.mark.parametrize("text,kw,reasoning,content,calls", CASES)
def test_the_whole_text_splits_as_written(text, kw, reasoning, content, calls):
    a = split(text, ids=ids(), **kw)
    assert (a.reasoning, a.content) == (reasoning, content)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in a.tool_calls] == calls
    assert [c["index"] for c in a.tool_calls] == list(range(len(calls)))


@pytest.mark.parametrize("text,kw,reasoning,content,calls", CASES)
def test_every_split_reassembles_to_the_whole(text, kw, reasoning, content, calls):
    whole = flat(split(text, ids=ids(), **kw))
    for cut in range(len(text) + 1):  # every single split point
        answer, built = streamed(text, [cut], **kw)
        assert flat(answer) == whole == built, cut
    rng = random.Random(len(text))
    for _ in range(200):  # many split points at once, down to one character a piece
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(1, len(text))))
        answer, built = streamed(text, cuts, **kw)
        assert flat(answer) == whole == built, cuts


def test_text_streams_on_while_no_tag_can_begin():
    s = Splitter(reasoning=True, opened=True)
    assert [d.reasoning for d in s.push("thinking <")] == ["thinking "]  # "<" may begin </think>
    assert [d.reasoning for d in s.push("b")] == ["<b"]
    s = Splitter(tools=HERMES)
    assert [d.content for d in s.push("Hi <tool")] == ["Hi "]
    assert s.push("_call>{\"name\": \"f\", \"arguments\": {}}") == []
    (d,) = s.push("</tool_call>")
    assert d.tool_call["function"] == {"name": "f", "arguments": "{}"}


def test_a_special_token_tag_arrives_by_id():
    s = Splitter(tools=MISTRAL, marks={7: "[TOOL_CALLS]"}, ids=ids())
    s.push("")
    s.push("", 7)
    s.push('[{"name": "f", "arguments": {"a": 1}}]')
    s.finish()
    assert s.answer.tool_calls[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}


def test_a_prompt_that_opens_the_reasoning():
    assert opens_thinking("<｜Assistant｜><think>\n")
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_thinking("<|im_start|>assistant\n")


def test_the_format_comes_from_the_template():
    assert tool_format("{{ '<tool_call>' }}") == HERMES
    assert tool_format("{{ '<tool_call>\\n<function=' + name + '>\\n<parameter=' + key + '>' }}") == XML
    assert tool_format("{{ '[TOOL_CALLS]' }}") == MISTRAL
    assert tool_format("{{ 'Environment: ipython' }}") == JSON
    assert tool_format(None) == JSON


TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}


def test_tools_and_choices_are_checked():
    assert check_tools([TOOL]) == [TOOL]
    assert check_tool_choice(None, [TOOL]) == "auto"
    assert check_tool_choice(None, []) == "none"
    assert check_tool_choice({"type": "function", "function": {"name": "get_weather"}}, [TOOL]) == "get_weather"
    bad = [([{"type": "function"}], None), ([TOOL, TOOL], None), ([{"type": "code"}], None),
           ([{"type": "function", "function": {"name": "a b"}}], None)]
    for tools, _ in bad:
        with pytest.raises(InvalidArgumentError):
            check_tools(tools)
    with pytest.raises(InvalidArgumentError, match="needs tools"):
        check_tool_choice("required", [])
    with pytest.raises(InvalidArgumentError, match="which tools do not list"):
        check_tool_choice({"type": "function", "function": {"name": "nope"}}, [TOOL])


def test_calls_from_a_client_go_to_the_template_with_object_arguments():
    calls = check_tool_calls([{"id": "c1", "type": "function",
                               "function": {"name": "f", "arguments": '{"a": 1}'}}], "messages[1]")
    assert for_template(calls)[0]["function"]["arguments"] == {"a": 1}
    assert calls[0]["function"]["arguments"] == '{"a": 1}'
    with pytest.raises(InvalidArgumentError, match="tool_calls"):
        check_tool_calls([], "messages[1]")


def test_parse_calls_refuses_what_is_not_a_call():
    assert parse_calls(HERMES, '{"name": "f", "arguments": {"a": 1}}') == [("f", '{"a": 1}')]
    assert parse_calls(HERMES, '{"name": "f", "arguments": "{\\"a\\": 1}"}') == [("f", '{"a": 1}')]
    for text in ('{"name": 3}', '{"name": "f", "arguments": [1]}', '{"name": "f", "other": 1}', "[]", "x"):
        assert parse_calls(HERMES, text) is None, text
    assert json.loads(parse_calls(JSON, '{"name": "f", "parameters": {"b": [true]}}')[0][1]) == {"b": [True]}
