"""Real chat templates, read from a GGUF file's metadata and rendered in arcpy's sandbox: Qwen3
(enable_thinking, its <think> handling), SmolLM3 (/think and /no_think, enable_thinking),
Phi-3.5-mini, Mistral Small 3.2 and Gemma 2 (llama.cpp's copies of the models' own templates,
tests/llamacpp_sdist.py), and the templates llama.cpp's vocabulary files carry. Each render is
checked against the text the template must write (worked out from the template by hand) and
against plain jinja2's immutable sandbox, configured as Hugging Face renders templates.

Gemma 3's template is not among llama.cpp's copies: its system-turn handling (the system message
folded into the first user turn) is checked on a template of the test's own in that shape.
"""

from __future__ import annotations

import datetime
import json
import time

import jinja2.ext
import numpy as np
import pytest
from gguf import GGUFWriter
from jinja2.sandbox import ImmutableSandboxedEnvironment
from llamacpp_sdist import llamacpp_models

from arcpy.errors import InvalidArgumentError
from arcpy.loop.prompt import request_ids
from arcpy.loop.request import Request
from arcpy.model.gguf_file import read_gguf
from arcpy.model.gguf_vocab import read_vocabulary
from arcpy.text import TextSpec, chat_ids, encode, gguf_text_spec, limits, render_chat, sandbox
from arcpy.vocabulary import BYTE, CONTROL, NORMAL, UNKNOWN

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Why?"}]
NO_SYSTEM = CHAT[1:]


# -- the files ----------------------------------------------------------------------------------

def template(name: str) -> str:
    return (llamacpp_models() / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


def write_vocab_gguf(path, tokens, types, template_text, *, kind="llama", scores=None, merges=(), pre=None,
                     bos=None, eos=None, add_bos=None, add_space_prefix=None):
    """A vocabulary-only GGUF file, as llama.cpp's ggml-vocab files are, with `template_text` as
    its tokenizer.chat_template."""
    w = GGUFWriter(path, "llama")
    w.add_string("tokenizer.ggml.model", kind)
    w.add_array("tokenizer.ggml.tokens", list(tokens))
    w.add_array("tokenizer.ggml.token_type", [int(t) for t in types])
    if scores is not None:
        w.add_array("tokenizer.ggml.scores", [float(s) for s in scores])
    if merges:
        w.add_array("tokenizer.ggml.merges", list(merges))
    if pre is not None:
        w.add_string("tokenizer.ggml.pre", pre)
    for key, value in (("bos", bos), ("eos", eos)):
        if value is not None:
            w.add_uint32(f"tokenizer.ggml.{key}_token_id", value)
    for key, value in (("add_bos_token", add_bos), ("add_space_prefix", add_space_prefix)):
        if value is not None:
            w.add_bool(f"tokenizer.ggml.{key}", value)
    w.add_string("tokenizer.chat_template", template_text)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def vocabulary_of(path):
    """The Vocabulary arcpy reads from a vocabulary-only GGUF file."""
    f = read_gguf(path)
    return read_vocabulary(f.meta, len(f.meta.strings("tokenizer.ggml.tokens")))


def read_spec(path):
    """The TextSpec arcpy reads from a GGUF file: its tokenizer and its chat template."""
    return gguf_text_spec(vocabulary_of(path))


def spec_with(tmp_path, vocab: str, template_text: str):
    """llama.cpp's ggml-vocab-`vocab`.gguf tokenizer, written again with `template_text`."""
    v = vocabulary_of(llamacpp_models() / f"ggml-vocab-{vocab}.gguf")
    path = write_vocab_gguf(tmp_path / f"{vocab}.gguf", v.tokens, v.types, template_text, kind=v.kind,
                            scores=v.scores, merges=v.merges, pre=v.pre if v.kind == "gpt2" else None,
                            bos=v.bos_id, eos=v.eos_ids[0] if v.eos_ids else None, add_bos=v.add_bos,
                            add_space_prefix=v.add_space_prefix)
    return read_spec(path)


def small_spec(tmp_path, template_text: str, bos: str | None, eos: str, controls, add_bos: bool):
    """A small SentencePiece vocabulary (byte fallback) with the family's control tokens."""
    tokens = ["<unk>", *([bos] if bos else []), eos, *controls, "\u2581"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN] + [CONTROL] * (len(controls) + 1 + bool(bos)) + [NORMAL] + [BYTE] * 256
    path = write_vocab_gguf(tmp_path / "small.gguf", tokens, types, template_text, scores=np.zeros(len(tokens)),
                            bos=1 if bos else None, eos=tokens.index(eos), add_bos=add_bos)
    return read_spec(path)


# -- the oracle ---------------------------------------------------------------------------------

def _refuse(message):
    raise ValueError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson: plain text (jinja2's own is HTML-safe markup, which escapes the text
    it is added to), the keys in their order."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def jinja2_render(template_text: str, spec, messages, add_generation_prompt=True, **kwargs) -> str:
    """The template rendered by plain jinja2, as Hugging Face's transformers sets it up."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals.update(raise_exception=_refuse, strftime_now=lambda f: datetime.datetime.now().strftime(f))
    env.filters["tojson"] = _tojson
    context = dict(kwargs, messages=messages, add_generation_prompt=add_generation_prompt)
    if spec.bos_id is not None:
        context["bos_token"] = spec.token_text(spec.bos_id)
    if spec.eos_ids:
        context["eos_token"] = spec.token_text(spec.eos_ids[0])
    return env.from_string(template_text).render(context)


def rendered(spec, messages, add_generation_prompt=True, **kwargs) -> str:
    """arcpy's render, checked against plain jinja2's."""
    text = render_chat(spec, messages, add_generation_prompt, template_kwargs=kwargs)
    assert text == jinja2_render(spec.chat_template, spec, messages, add_generation_prompt, **kwargs)
    return text


def count(spec, ids, token: str) -> int:
    return ids.count(spec.tokenizer.token_to_id(token))


# -- Qwen3 --------------------------------------------------------------------------------------

QWEN3_TURNS = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
               "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return spec_with(tmp_path_factory.mktemp("qwen3"), "qwen2", template("Qwen-Qwen3-0.6B"))


def test_qwen3_renders_the_turns_and_the_answers_header(qwen3):
    assert rendered(qwen3, CHAT) == QWEN3_TURNS + "<|im_start|>assistant\n"
    assert rendered(qwen3, CHAT, add_generation_prompt=False) == QWEN3_TURNS
    assert rendered(qwen3, CHAT, enable_thinking=True) == QWEN3_TURNS + "<|im_start|>assistant\n"


def test_qwen3_without_thinking_opens_an_empty_think_block(qwen3):
    assert rendered(qwen3, CHAT, enable_thinking=False) == QWEN3_TURNS + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert rendered(qwen3, CHAT, add_generation_prompt=False, enable_thinking=False) == QWEN3_TURNS


def test_qwen3_drops_the_reasoning_of_earlier_answers_and_keeps_that_of_the_last(qwen3):
    thought = "<think>\nLet me see.\n</think>\n\nHello!"
    earlier = [*CHAT[:2], {"role": "assistant", "content": thought}, CHAT[3]]
    assert rendered(qwen3, earlier) == QWEN3_TURNS + "<|im_start|>assistant\n"
    last = [CHAT[1], {"role": "assistant", "content": thought}]
    assert rendered(qwen3, last, add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" + thought + "<|im_end|>\n")


def test_qwen3_prompt_ids_have_the_markup_as_control_tokens_and_no_bos(qwen3):
    ids = chat_ids(qwen3, CHAT, template_kwargs={"enable_thinking": False})
    text = render_chat(qwen3, CHAT, template_kwargs={"enable_thinking": False})
    assert ids == encode(qwen3, text, parse_special=True)
    assert (count(qwen3, ids, "<|im_start|>"), count(qwen3, ids, "<|im_end|>")) == (5, 4)
    assert not qwen3.add_bos and qwen3.bos_id not in ids
    thinking_off = Request(messages=CHAT, template_kwargs={"enable_thinking": False})
    assert request_ids(qwen3, thinking_off) == ids != request_ids(qwen3, Request(messages=CHAT))


# -- SmolLM3 ------------------------------------------------------------------------------------

def smollm3_header(mode: str, instructions: str) -> str:
    return (f"<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: {mode}\n\n"
            f"## Custom Instructions\n\n{instructions}\n\n<|im_end|>\n")


def smollm3_turns(thinking: bool) -> str:
    empty = "" if thinking else "<think>\n\n</think>\n"
    return (f"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n{empty}Hello!<|im_end|>\n"
            "<|im_start|>user\nWhy?<|im_end|>\n")


@pytest.fixture(scope="module")
def smollm3(tmp_path_factory):
    return small_spec(tmp_path_factory.mktemp("smollm3"), template("HuggingFaceTB-SmolLM3-3B"), None,
                      "<|im_end|>", ["<|im_start|>"], add_bos=False)


def test_smollm3_thinks_by_default_and_not_with_enable_thinking_false(smollm3):
    thinking = smollm3_header("/think", "Be brief.") + smollm3_turns(True)
    assert rendered(smollm3, CHAT) == thinking + "<|im_start|>assistant\n"
    assert rendered(smollm3, CHAT, add_generation_prompt=False) == thinking
    assert rendered(smollm3, CHAT, enable_thinking=True) == thinking + "<|im_start|>assistant\n"
    plain = smollm3_header("/no_think", "Be brief.") + smollm3_turns(False)
    assert rendered(smollm3, CHAT, enable_thinking=False) == plain + "<|im_start|>assistant\n<think>\n\n</think>\n"
    assert rendered(smollm3, CHAT, add_generation_prompt=False, enable_thinking=False) == plain


def test_smollm3_flags_in_the_system_message_win_and_are_cut_from_it(smollm3):
    no_think = [{"role": "system", "content": "Be brief. /no_think"}, *NO_SYSTEM]
    assert rendered(smollm3, no_think) == (smollm3_header("/no_think", "Be brief.") + smollm3_turns(False)
                                           + "<|im_start|>assistant\n<think>\n\n</think>\n")
    think = [{"role": "system", "content": "Be brief. /think"}, *NO_SYSTEM]
    assert rendered(smollm3, think, enable_thinking=False) == (smollm3_header("/think", "Be brief.")
                                                               + smollm3_turns(True) + "<|im_start|>assistant\n")


def test_smollm3_without_a_system_message_writes_its_default_one(smollm3):
    for kwargs, mode in (({}, "/think"), ({"enable_thinking": False}, "/no_think")):
        text = rendered(smollm3, NO_SYSTEM, **kwargs)
        assert text.startswith(f"<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\n"
                               f"Reasoning Mode: {mode}\n\n## Custom Instructions\n\nYou are a helpful AI assistant")
        assert text.endswith(smollm3_turns(mode == "/think") + "<|im_start|>assistant\n"
                             + ("" if mode == "/think" else "<think>\n\n</think>\n"))
    ids = chat_ids(smollm3, NO_SYSTEM)
    assert (count(smollm3, ids, "<|im_start|>"), count(smollm3, ids, "<|im_end|>")) == (5, 4)


# -- Phi-3.5-mini and Phi-3 ---------------------------------------------------------------------

PHI_TURNS = "<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nWhy?<|end|>\n"


@pytest.fixture(scope="module")
def phi35(tmp_path_factory):
    return spec_with(tmp_path_factory.mktemp("phi35"), "phi-3", template("microsoft-Phi-3.5-mini-instruct"))


def test_phi35_renders_its_turns_and_ends_with_eos_without_the_answers_header(phi35):
    system = "<|system|>\nBe brief.<|end|>\n"
    assert rendered(phi35, CHAT) == system + PHI_TURNS + "<|assistant|>\n"
    assert rendered(phi35, CHAT, add_generation_prompt=False) == system + PHI_TURNS + "<|endoftext|>"
    empty = [{"role": "system", "content": ""}, *NO_SYSTEM]
    assert rendered(phi35, empty) == PHI_TURNS + "<|assistant|>\n"


def test_phi35_prompt_ids_start_with_bos_which_the_template_does_not_write(phi35):
    text = render_chat(phi35, CHAT)
    ids = chat_ids(phi35, CHAT)
    assert phi35.add_bos and not text.startswith("<s>")
    assert ids[0] == phi35.bos_id and ids.count(phi35.bos_id) == 1 and ids == encode(phi35, text, parse_special=True)
    assert (count(phi35, ids, "<|user|>"), count(phi35, ids, "<|assistant|>"), count(phi35, ids, "<|end|>")) == (2, 2, 4)


def test_the_phi3_vocabulary_files_own_template_writes_bos_once():
    phi3 = read_spec(llamacpp_models() / "ggml-vocab-phi-3.gguf")
    assert rendered(phi3, CHAT) == "<s>" + PHI_TURNS + "<|assistant|>\n"  # this one drops the system message
    ids = chat_ids(phi3, CHAT)
    assert ids[0] == phi3.bos_id and ids.count(phi3.bos_id) == 1


# -- Mistral Small 3.2 --------------------------------------------------------------------------

MISTRAL_CONTROLS = ["[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    return small_spec(tmp_path_factory.mktemp("mistral"), template("Mistral-Small-3.2-24B-Instruct-2506"), "<s>",
                      "</s>", MISTRAL_CONTROLS, add_bos=True)


def test_mistral_small_renders_system_prompt_and_instructions(mistral):
    expected = "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Hi[/INST]Hello!</s>[INST]Why?[/INST]"
    assert rendered(mistral, CHAT) == expected
    assert rendered(mistral, CHAT, add_generation_prompt=False) == expected  # it writes no answer header
    ids = chat_ids(mistral, CHAT)
    assert ids.count(mistral.bos_id) == 1 and ids[0] == mistral.bos_id and ids.count(mistral.eos_ids[0]) == 1
    assert [count(mistral, ids, t) for t in MISTRAL_CONTROLS] == [2, 2, 1, 1]


def test_mistral_small_without_a_system_message_writes_its_default_one_with_todays_date(mistral):
    text = rendered(mistral, NO_SYSTEM)
    assert text.startswith("<s>[SYSTEM_PROMPT]You are Mistral Small 3") and text.endswith(
        "[/SYSTEM_PROMPT][INST]Hi[/INST]Hello!</s>[INST]Why?[/INST]")
    assert f"The current date is {datetime.date.today().isoformat()}." in text


def test_mistral_small_refuses_turns_that_do_not_alternate_in_one_line(mistral):
    with pytest.raises(InvalidArgumentError) as e:
        render_chat(mistral, [CHAT[1], CHAT[1]])
    assert "roles must alternate" in str(e.value) and "\n" not in str(e.value)


# -- Gemma ------------------------------------------------------------------------------------

GEMMA_TURNS = ("<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nWhy?<end_of_turn>\n")
# The test's own template in Gemma 3's shape: the system message is folded into the first user turn.
GEMMA3_SHAPE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set prefix = '' -%}
    {%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception('roles must alternate user/assistant') }}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') }}
    {%- if message['content'] is string -%}{{ message['content'] | trim }}{%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"""


def gemma(tmp_path, template_text):
    return small_spec(tmp_path, template_text, "<bos>", "<eos>", ["<start_of_turn>", "<end_of_turn>"], add_bos=True)


def test_gemma2_renders_user_and_model_turns_and_refuses_a_system_message(tmp_path):
    spec = gemma(tmp_path, template("google-gemma-2-2b-it"))
    turns = "<bos><start_of_turn>user\nHi<end_of_turn>\n" + GEMMA_TURNS
    assert rendered(spec, NO_SYSTEM) == turns + "<start_of_turn>model\n"
    assert rendered(spec, NO_SYSTEM, add_generation_prompt=False) == turns
    with pytest.raises(InvalidArgumentError) as e:
        render_chat(spec, CHAT)
    assert "System role not supported" in str(e.value) and "\n" not in str(e.value)


def test_gemma3_shape_folds_the_system_message_into_the_first_user_turn(tmp_path):
    spec = gemma(tmp_path, GEMMA3_SHAPE)
    folded = "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n" + GEMMA_TURNS
    assert rendered(spec, CHAT) == folded + "<start_of_turn>model\n"
    assert rendered(spec, CHAT, add_generation_prompt=False) == folded
    assert rendered(spec, NO_SYSTEM) == "<bos><start_of_turn>user\nHi<end_of_turn>\n" + GEMMA_TURNS + (
        "<start_of_turn>model\n")
    ids = chat_ids(spec, CHAT)
    assert ids[0] == spec.bos_id and ids.count(spec.bos_id) == 1 and count(spec, ids, "<start_of_turn>") == 4


# -- every template llama.cpp carries -----------------------------------------------------------

def test_every_template_of_the_vocabulary_files_renders_as_jinja2_renders_it():
    carried = 0
    for path in sorted(llamacpp_models().glob("ggml-vocab-*.gguf")):
        f = read_gguf(path)
        if f.meta.text("tokenizer.chat_template", None) is None or f.meta.text("tokenizer.ggml.model") not in (
                "gpt2", "llama"):
            continue
        spec = read_spec(path)
        for messages in (CHAT, NO_SYSTEM):
            for prompt in (True, False):
                rendered(spec, messages, prompt)
        carried += 1
    assert carried >= 4  # command-r, phi-3, qwen2, qwen35


def test_every_template_llama_cpp_carries_renders_as_jinja2_renders_it(qwen3):
    """Where plain jinja2 renders a template (a few need names a request does not give, or the
    {% generation %} tag it lacks), arcpy's sandbox writes the same text."""
    paths = sorted((llamacpp_models() / "templates").glob("*.jinja"))
    same = 0
    for path in paths:
        text = path.read_text(encoding="utf-8")
        spec = TextSpec(qwen3.tokenizer, qwen3.bos_id, qwen3.eos_ids, False, text)
        for messages in (CHAT, NO_SYSTEM):
            try:
                expected = jinja2_render(text, spec, messages)
            except Exception:
                continue
            assert render_chat(spec, messages) == expected, path.name
            same += 1
    assert same >= len(paths)


def test_the_bounds_of_a_template_are_far_from_every_real_one():
    """A template's size limit is over seven times the largest of llama.cpp's real templates, and each
    compiles in a small part of the compile deadline."""
    paths = sorted((llamacpp_models() / "templates").glob("*.jinja"))
    sizes = {path.name: len(path.read_text(encoding="utf-8")) for path in paths}
    assert len(sizes) >= 60 and 7 * max(sizes.values()) <= limits.MAX_TEMPLATE_CHARS
    for path in paths:
        source = path.read_text(encoding="utf-8")
        seconds = []
        for _ in range(3):  # the best of three: a busy machine's pauses are not the template's
            start = time.perf_counter()
            sandbox.compile_template.__wrapped__(source)
            seconds.append(time.perf_counter() - start)
        assert min(seconds) < limits.COMPILE_DEADLINE_S / 5, (path.name, seconds)
