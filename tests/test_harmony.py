"""gpt-oss's harmony format (arcpy.text.harmony): headers read, the tags read back by id as the
server's decoder hands them over, the format and the end of an answer (<|return|>, <|call|>) found
in the template and the vocabulary, a harmony template's prompt (the test's own template in that
shape, and llama.cpp's copy of gpt-oss's, tests/llamacpp_sdist.py) with tools, reasoning effort,
the developer's instructions, calls with their reasoning and the tools' results, and the grammar
of a required call. The answer splitter's cases at every split point are in test_answer."""

from __future__ import annotations

import json

import jsonschema
import pytest
from agent_helpers import QWEN3, family_text, harmony_text, typist_engine
from llamacpp_sdist import llamacpp_models
from test_chat_families import jinja2_render, small_spec
from tokenizers import Tokenizer

from arcpy.errors import InvalidArgumentError
from arcpy.loop.constrain import resolve
from arcpy.loop.request import Request
from arcpy.sampling import Sampling
from arcpy.text import StreamDecoder, chat_ids, encode, load_text_spec, render_chat
from arcpy.text.answer import Splitter, special_marks, split, thinks
from arcpy.text.harmony import CALL, CHANNEL, MESSAGE, RETURN, START, TAGS, Header, read_header
from arcpy.text.turns import turn_end_ids
from arcpy.text.tools import HARMONY, tool_format

# The test's own template in harmony's shape: the system message with the reasoning effort, the
# developer's with the instructions and the tools, an assistant's reasoning kept where it led to a
# call, calls as messages to the function, the tool's result as the function's message.
HARMONY_SHAPE = """<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}<|end|>
{%- set first = messages[0] if messages[0].role in ('system', 'developer') else none -%}
{%- if first or tools -%}<|start|>developer<|message|>
{%- if first %}# Instructions\n\n{{ first.content }}{% endif -%}
{%- if tools %}# Tools\n{% for t in tools %}type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any;\n{% endfor %}{% endif -%}
<|end|>{%- endif -%}
{%- set last = namespace(name=none) -%}
{%- set turns = messages[1:] if first else messages -%}
{%- for m in turns -%}
{%- if m.role == 'assistant' and m.tool_calls -%}
{%- if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{% endif -%}
{%- set call = m.tool_calls[0].function -%}
<|start|>assistant to=functions.{{ call.name }}<|channel|>commentary json<|message|>{{ call.arguments | tojson }}<|call|>
{%- set last.name = call.name -%}
{%- elif m.role == 'assistant' -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'tool' -%}<|start|>functions.{{ last.name }} to=assistant<|channel|>commentary<|message|>{{ m.content }}<|end|>
{%- else -%}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city's name."},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CALLED = {"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}
FLOW = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "The user wants weather.", "tool_calls": [CALLED]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'}]
ANSWER = ("<|channel|>analysis<|message|>The user wants weather.<|end|><|start|>assistant<|channel|>commentary "
          'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "unit": "celsius"}<|call|>')


@pytest.fixture(scope="module")
def spec():
    return harmony_text(HARMONY_SHAPE)


def test_a_header_names_its_channel_and_its_recipient():
    assert read_header("<|channel|>analysis") == Header("analysis", None)
    assert read_header("<|start|>assistant<|channel|>final") == Header("final", None)
    for header in ("<|channel|>commentary to=functions.get_weather <|constrain|>json",
                   " to=functions.get_weather<|channel|>commentary json",
                   "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"):
        h = read_header(header)
        assert (h.channel, h.recipient, h.function) == ("commentary", "functions.get_weather", "get_weather"), header
    assert read_header("<|channel|>commentary to=browser.search").function == "browser.search"
    assert read_header("assistant").channel == "" and read_header("assistant").function is None


def test_the_format_and_its_tags_come_from_the_template_and_the_vocabulary(spec):
    assert tool_format(HARMONY_SHAPE) == HARMONY and thinks(spec)
    assert sorted(special_marks(spec).values()) == sorted(TAGS)
    # <|end|> is a special token of other vocabularies (Phi-3's): read back only for a harmony template.
    other = harmony_text("{% for m in messages %}<|start|>{{ m.content }}<|end|>{% endfor %}")
    assert tool_format(other.chat_template) != HARMONY and not special_marks(other)


def test_the_tags_arrive_by_id_as_the_decoder_skips_them(spec):
    """Token by token as the server hands them over (the decoder's text and the token's id), the
    answer splits as its text does."""
    ids = encode(spec, ANSWER, parse_special=True)
    assert ids.count(spec.tokenizer.token_to_id(CHANNEL)) == 2 and ids[-1] == spec.tokenizer.token_to_id(CALL)
    decoder, marks = StreamDecoder(spec), special_marks(spec)
    s = Splitter(reasoning=True, tools=HARMONY, harmony=True, marks=marks, ids=lambda fmt: "call_x")
    for i in ids[:-1]:  # <|call|> ends the answer on the device: the splitter never sees it
        s.push(decoder.push(i), i)
    s.push(decoder.flush())
    s.finish()
    whole = split(ANSWER, reasoning=True, tools=HARMONY, harmony=True, ids=lambda fmt: "call_x")
    assert s.answer == whole and whole.reasoning == "The user wants weather." and whole.content == ""
    assert [c["function"] for c in whole.tool_calls] == [CALLED["function"]]


def test_return_and_call_end_an_answer_in_a_tokenizer_json_directory(tmp_path, spec):
    (tmp_path / "tokenizer.json").write_text(spec.tokenizer.to_str())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|return|>",
                                                                "chat_template": HARMONY_SHAPE}))
    loaded = load_text_spec(tmp_path)
    ends = [spec.tokenizer.token_to_id(t) for t in (RETURN, CALL)]
    assert loaded.eos_ids == tuple(ends)
    assert load_text_spec(QWEN3).eos_ids == family_text().eos_ids  # no harmony tags: no more ends
    assert turn_end_ids(Tokenizer.from_file(str(QWEN3 / "tokenizer.json"))) == ()


def test_return_and_call_end_an_answer_in_a_gguf_vocabulary(tmp_path):
    others = [t for t in TAGS if t != RETURN]
    gguf = small_spec(tmp_path, HARMONY_SHAPE, "<|startoftext|>", RETURN, others, add_bos=False)
    assert [gguf.token_text(i) for i in gguf.eos_ids] == [RETURN, CALL]
    assert special_marks(gguf) and sorted(special_marks(gguf).values()) == sorted(TAGS)


def test_the_prompt_has_the_markup_as_control_tokens_and_the_users_tags_as_text(spec):
    text = render_chat(spec, FLOW, tools=[WEATHER], template_kwargs={"reasoning_effort": "high"})
    assert text.startswith("<|start|>system<|message|>Reasoning: high<|end|><|start|>developer<|message|>"
                           "# Instructions\n\nBe brief.# Tools\ntype get_weather = (_: ")
    assert text.endswith("<|start|>user<|message|>Weather in Paris?<|end|>"
                         "<|start|>assistant<|channel|>analysis<|message|>The user wants weather.<|end|>"
                         "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
                         '{"city": "Paris", "unit": "celsius"}<|call|>'
                         '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>'
                         '{"temperature": 18}<|end|><|start|>assistant')
    ids = chat_ids(spec, FLOW, tools=[WEATHER])
    start = spec.tokenizer.token_to_id(START)
    assert ids.count(start) == 7 and ids[-1 - len(encode(spec, "assistant"))] == start
    assert ids == encode(spec, render_chat(spec, FLOW, tools=[WEATHER]), parse_special=True)
    typed = [{"role": "user", "content": "say <|channel|>final<|message|>"}]
    typed_ids = chat_ids(spec, typed)
    assert typed_ids.count(spec.tokenizer.token_to_id(CHANNEL)) == 0
    assert typed_ids.count(spec.tokenizer.token_to_id(MESSAGE)) == 2  # the system's and the user's headers


def test_reasoning_content_goes_only_with_an_assistants_message(spec):
    with pytest.raises(InvalidArgumentError, match="only an assistant's message has reasoning_content"):
        render_chat(spec, [{"role": "user", "content": "x", "reasoning_content": "y"}])
    with pytest.raises(InvalidArgumentError, match="only an assistant's message has reasoning_content"):
        Request(messages=[{"role": "user", "content": "x", "reasoning_content": "y"}])


# -- gpt-oss's own template (llama.cpp's copy) --------------------------------------------------

@pytest.fixture(scope="module")
def gpt_oss():
    return harmony_text((llamacpp_models() / "templates" / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8"))


def test_gpt_oss_renders_tools_effort_instructions_calls_and_results_as_jinja2_does(gpt_oss):
    kw = {"reasoning_effort": "low"}
    text = render_chat(gpt_oss, FLOW, tools=[WEATHER], template_kwargs=kw)
    assert text == jinja2_render(gpt_oss.chat_template, gpt_oss, render_messages(FLOW), tools=[WEATHER], **kw)
    assert text.startswith("<|start|>system<|message|>You are ChatGPT")
    assert "Reasoning: low\n\n" in text and "Calls to these tools must go to the commentary channel" in text
    assert "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n" in text
    assert "// The city's name.\ncity: string,\nunit: \"celsius\" | \"fahrenheit\",\n}) => any;" in text
    # The reasoning of a call with no final answer after it goes back as the analysis before the call.
    assert text.endswith("<|start|>user<|message|>Weather in Paris?<|end|>"
                         "<|start|>assistant<|channel|>analysis<|message|>The user wants weather.<|end|>"
                         "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
                         '{"city": "Paris", "unit": "celsius"}<|call|>'
                         "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
                         '"{\\"temperature\\": 18}"<|end|><|start|>assistant')
    plain = render_chat(gpt_oss, FLOW[1:2])
    assert "Reasoning: medium" in plain and "<|start|>developer" not in plain
    assert plain == jinja2_render(gpt_oss.chat_template, gpt_oss, FLOW[1:2])
    developer = render_chat(gpt_oss, [{"role": "developer", "content": "Be brief."}, FLOW[1]])
    assert developer == render_chat(gpt_oss, FLOW[:2])  # OpenAI's developer role is the system's


def render_messages(messages):
    """The messages as arcpy hands them to a template: calls' arguments as objects, the
    reasoning as `thinking` too."""
    out = []
    for m in messages:
        m = dict(m)
        if "tool_calls" in m:
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        if "reasoning_content" in m:
            m["thinking"] = m["reasoning_content"]
        out.append(m)
    return out


def test_gpt_oss_final_answers_drop_their_reasoning(gpt_oss):
    answered = [*FLOW, {"role": "assistant", "content": "18 degrees.", "reasoning_content": "Easy."},
                {"role": "user", "content": "Thanks"}]
    text = render_chat(gpt_oss, answered, tools=[WEATHER])
    assert "<|start|>assistant<|channel|>final<|message|>18 degrees.<|end|>" in text
    assert "Easy." not in text and "The user wants weather." not in text  # a final answer came after the call


# -- the grammar of a required call -------------------------------------------------------------

SHORT = {"type": "function", "function": {**WEATHER["function"], "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}  # a random string ends within the budget


def test_a_required_call_is_a_call_message_whose_tags_are_the_tokens(spec):
    r = Request(messages=[{"role": "user", "content": "Hi"}], max_new_tokens=200, tools=[SHORT],
                tool_choice="required")
    grammar = resolve(spec, r).source
    ids = {t: spec.tokenizer.token_to_id(t) for t in TAGS}
    assert f'<[{ids[CHANNEL]}]> "commentary to=functions." "get_weather "' in grammar
    engine = typist_engine(spec, lambda prompt: "<|channel|>final<|message|>Hello.")
    for seed in range(5):
        pieces = list(engine.stream(Request(messages=r.messages, max_new_tokens=200, tools=[SHORT],
                                            tool_choice="required", sampling=Sampling(temperature=1.0, seed=seed))))
        assert pieces[0].token == ids[CHANNEL]
        s = Splitter(reasoning=True, tools=HARMONY, harmony=True, marks=special_marks(spec))
        for p in pieces:
            s.push(p.text, p.token)
        s.finish()
        (call,) = s.answer.tool_calls
        assert call["function"]["name"] == "get_weather" and s.answer.content == s.answer.reasoning == ""
        jsonschema.validate(json.loads(call["function"]["arguments"]), SHORT["function"]["parameters"])


def test_gpt_oss_renders_a_calls_reasoning_as_transformers_does(gpt_oss):
    """transformers' apply_chat_template given the reasoning as gpt-oss's `thinking`, arcpy given
    it as OpenAI-style reasoning_content."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=gpt_oss.tokenizer, eos_token=RETURN)
    tok.chat_template = gpt_oss.chat_template
    theirs = tok.apply_chat_template(render_messages(FLOW), tools=[WEATHER], tokenize=False, add_generation_prompt=True,
                                     reasoning_effort="high")
    ours = render_chat(gpt_oss, FLOW, tools=[WEATHER], template_kwargs={"reasoning_effort": "high"})
    assert ours == theirs and "<|channel|>analysis<|message|>The user wants weather.<|end|>" in ours
