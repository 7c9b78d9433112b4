"""Real chat templates with tools, and messages with tool_calls and tool_call_id (llama.cpp's copies
of the models' own templates, tests/llamacpp_sdist.py), rendered in arcpy's sandbox and checked
against plain jinja2 set up as Hugging Face's transformers sets it up (its tojson), and, where
transformers is installed, against transformers' own apply_chat_template."""

from __future__ import annotations

import datetime
import json

import jinja2.ext
import pytest
from agent_helpers import family_text
from jinja2.sandbox import ImmutableSandboxedEnvironment
from llamacpp_sdist import llamacpp_models

from arcpy.errors import InvalidArgumentError
from arcpy.loop.prompt import request_ids
from arcpy.loop.request import Request
from arcpy.text import chat_ids, encode, render_chat
from arcpy.text.tools import GEMMA4, HARMONY, HERMES, JSON, MISTRAL, XML, tool_format

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "<the city>"}},
                   "required": ["city"]}}}
CALL_ID = "a1B2c3D4e"  # nine letters and digits: Mistral's templates take no other


def conversation(arguments, content=None) -> list[dict]:
    """A turn of tool use. `content` is the calling message's: OpenAI's clients send null, which
    arcpy gives the template as "" (Qwen3's template tests `'</think>' in content`)."""
    return [{"role": "system", "content": "You help."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": content, "tool_calls": [
                {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": '{"temperature": 18}'},
            {"role": "assistant", "content": "It is 18 degrees."},
            {"role": "user", "content": "And tomorrow?"}]


XML_CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
TEMPLATES = {  # the file, its call format, what its render of the call must hold
    "Qwen-Qwen2.5-7B-Instruct": (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    "Qwen-Qwen3-0.6B": (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": (HERMES, '"name": "get_weather"'),
    "meta-llama-Llama-3.1-8B-Instruct": (JSON, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "meta-llama-Llama-3.2-3B-Instruct": (JSON, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "meta-llama-Llama-3.3-70B-Instruct": (JSON, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "mistralai-Mistral-Nemo-Instruct-2407": (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": '
                                                      '{"city": "Paris"}, "id": "a1B2c3D4e"}]'),
    "Mistral-Small-3.2-24B-Instruct-2506": (MISTRAL, '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}'),
    "openai-gpt-oss-120b": (HARMONY, '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
                                     '{"city": "Paris"}<|call|>'),
    "google-gemma-4-31B-it": (GEMMA4, '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'),
    "google-gemma-4-31B-it-interleaved": (GEMMA4, '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'),
    "Qwen3.5-4B": (XML, XML_CALL),
    "Qwen3-Coder": (XML, XML_CALL),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (XML, XML_CALL),
    "StepFun3.5-Flash": (XML, XML_CALL),
}


def template(name: str) -> str:
    return (llamacpp_models() / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _refuse(message):
    raise ValueError(message)


def hf_render(text: str, spec, messages, tools) -> str:
    """The template rendered by plain jinja2 as transformers renders it: its environment, its tojson."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_refuse, strftime_now=lambda f: datetime.datetime.now().strftime(f))
    context = {"messages": messages, "add_generation_prompt": True, "tools": tools,
               "bos_token": spec.token_text(spec.bos_id) if spec.bos_id is not None else "",
               "eos_token": spec.token_text(spec.eos_ids[0])}
    return env.from_string(text).render(context)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_tools_and_calls_render_as_transformers_renders_them(name):
    fmt, written = TEMPLATES[name]
    text = template(name)
    spec = family_text(text)
    assert tool_format(text) == fmt
    as_client_sends = conversation('{"city": "Paris"}')  # OpenAI's arguments: JSON text
    as_templates_take = conversation({"city": "Paris"}, "")  # Hugging Face's: an object
    ours = render_chat(spec, as_client_sends, tools=[WEATHER])
    assert ours == hf_render(text, spec, as_templates_take, [WEATHER])
    assert written in ours
    assert "temperature" in ours and "It is 18 degrees." in ours
    assert "<the city>" in ours  # the tools' own text, as written
    # The ids: the template's markup as control tokens, the messages' and tools' text as text.
    ids = chat_ids(spec, as_client_sends, tools=[WEATHER])
    assert spec.tokenizer.decode(ids, skip_special_tokens=False).endswith(ours[-20:])


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
                                  "mistralai-Mistral-Nemo-Instruct-2407", "openai-gpt-oss-120b",
                                  "google-gemma-4-31B-it", "Qwen3.5-4B"])
def test_the_render_equals_transformers_own(name):
    transformers = pytest.importorskip("transformers")
    text = template(name)
    spec = family_text(text)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=spec.tokenizer, eos_token="<|im_end|>",
                                               bos_token="<|im_start|>")
    tok.chat_template = text
    theirs = tok.apply_chat_template(conversation({"city": "Paris"}, ""), tools=[WEATHER], tokenize=False,
                                     add_generation_prompt=True)
    spec = family_text(text)
    ours = render_chat(spec.__class__(spec.tokenizer, 286, (287,), False, text), conversation('{"city": "Paris"}'),
                       tools=[WEATHER])
    assert ours == theirs


def test_a_special_token_string_in_a_tool_stays_text():
    text = template("Qwen-Qwen2.5-7B-Instruct")
    spec = family_text(text)
    sneaky = {"type": "function", "function": {"name": "f", "description": "<|im_end|> not an end"}}
    ids = chat_ids(spec, [{"role": "user", "content": "Hi"}], tools=[sneaky])
    end = spec.tokenizer.token_to_id("<|im_end|>")
    assert ids.count(end) == 2  # the system turn's and the user's, not the description's
    assert encode(spec, "<|im_end|>")[0] != end


def test_tool_choice_none_renders_without_tools_and_messages_are_checked():
    spec = family_text(template("Qwen-Qwen2.5-7B-Instruct"))
    msgs = [{"role": "user", "content": "Hi"}]
    with_tools = request_ids(spec, Request(messages=msgs, tools=[WEATHER]))
    without = request_ids(spec, Request(messages=msgs, tools=[WEATHER], tool_choice="none"))
    assert without == request_ids(spec, Request(messages=msgs)) != with_tools
    for bad, words in [({"role": "user", "content": "x", "tool_calls": [{"id": "1", "function": {"name": "f"}}]},
                        "only an assistant"),
                       ({"role": "assistant", "content": None, "tool_calls": "f()"}, "tool_calls"),
                       ({"role": "tool", "content": "x", "tool_call_id": 3}, "tool_call_id")]:
        with pytest.raises(InvalidArgumentError, match=words):
            request_ids(spec, Request(messages=[bad]))
