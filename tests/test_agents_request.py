"""Request's agent fields (arcpy.loop.request): tools, tool_choice, response_format, and messages
that carry tool calls; what each accepts, what it refuses in one line, and the constraint each
resolves to (arcpy.loop.constrain)."""

from __future__ import annotations

import pytest
from agent_helpers import family_text

from arcpy.errors import InvalidArgumentError
from arcpy.loop.constrain import resolve
from arcpy.loop.request import Constraint, Message, Request
from arcpy.text.grammar import GBNF, JSON_OBJECT, JSON_SCHEMA, LARK

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
HI = [{"role": "user", "content": "Hi"}]


def test_agent_fields_are_read_only_hashable_and_equal_by_value():
    a = Request(messages=HI, tools=[TOOL], tool_choice="required",
                response_format=None)
    b = Request(messages=HI, tools=[dict(TOOL)], tool_choice="required")
    assert a == b and hash(a) == hash(b)
    assert a.tool_choice == "required" and a.template_tools == [TOOL]
    a.template_tools[0]["function"]["name"] = "changed"  # a copy: the request is unchanged
    assert a.template_tools == [TOOL]
    assert Request(messages=HI, tools=[TOOL]).tool_choice == "auto"
    assert Request(messages=HI).tool_choice == "none"
    assert Request(messages=HI, tools=[TOOL], tool_choice="none").template_tools is None
    assert Request(messages=HI, tools=[TOOL], tool_choice="f").tool_choice == "f"
    named = {"type": "function", "function": {"name": "f"}}
    assert Request(messages=HI, tools=[TOOL], tool_choice=named).tool_choice == "f"


@pytest.mark.parametrize("fmt, kind", [({"type": "json_object"}, JSON_OBJECT),
                                       ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
                                        JSON_SCHEMA),
                                       ({"type": "grammar", "grammar": "root ::= \"a\""}, GBNF)])
def test_response_format_becomes_a_constraint(fmt, kind):
    r = Request(messages=HI, response_format=fmt)
    assert r.response_format.kind == kind and resolve(None, r) == r.response_format
    assert Request(messages=HI, response_format={"type": "text"}).response_format is None


@pytest.mark.parametrize("kw, words", [
    ({"response_format": {"type": "yaml"}}, "response_format must be"),
    ({"response_format": {"type": "json_object", "schema": {}}}, "response_format must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema: required"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "colour": 1}}}, "unsupported field"),
    ({"tools": {"f": 1}}, "tools must be an array"),
    ({"tools": [TOOL], "tool_choice": "always"}, "tool_choice must be"),
    ({"tool_choice": "required"}, "needs tools"),
    ({"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}, "both constrain"),
])
def test_bad_agent_fields_are_one_clear_error(kw, words):
    with pytest.raises(InvalidArgumentError, match=words):
        Request(messages=HI, **kw)


def test_tools_need_messages():
    with pytest.raises(InvalidArgumentError, match="give messages"):
        Request(prompt="Hi", tools=[TOOL])
    r = Request(prompt_ids=(1, 2), response_format={"type": "json_object"})  # a constraint needs no template
    assert r.response_format == Constraint(JSON_OBJECT)


def test_messages_with_tool_calls():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    m = Message("assistant", None, [call])
    assert m.content == "" and m.as_dict()["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    t = Message("tool", "42", tool_call_id="c1", name="f")
    assert t.as_dict() == {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"}
    r = Request(messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "content": "42", "tool_call_id": "c1"}])
    assert hash(r) == hash(Request(messages=list(r.messages)))
    with pytest.raises(InvalidArgumentError, match="only an assistant"):
        Message("user", "x", [call])
    with pytest.raises(InvalidArgumentError, match="tool_call_id must be a string"):
        Message("tool", "x", tool_call_id=7)


def test_a_required_choice_resolves_to_the_call_grammar_of_the_models_format():
    r = Request(messages=HI, tools=[TOOL], tool_choice="required")
    hermes = resolve(family_text("{{ '<tool_call>' }}"), r)
    assert hermes.kind == LARK and '"<tool_call>\\n"' in hermes.source
    plain = resolve(family_text("{{ messages }}"), r)
    assert "<tool_call>" not in plain.source and '"parameters"' in plain.source
    assert resolve(family_text(), Request(messages=HI, tools=[TOOL])) is None  # auto: nothing forced


def test_parallel_tool_calls_false_makes_a_required_choice_one_call():
    many = resolve(family_text("{{ '<tool_call>' }}"), Request(messages=HI, tools=[TOOL], tool_choice="required"))
    one = resolve(family_text("{{ '<tool_call>' }}"), Request(messages=HI, tools=[TOOL], tool_choice="required",
                                                              parallel_tool_calls=False))
    assert ")*" in many.source.splitlines()[0] and ")*" not in one.source.splitlines()[0]
    with pytest.raises(InvalidArgumentError, match="parallel_tool_calls must be"):
        Request(messages=HI, parallel_tool_calls="no")
