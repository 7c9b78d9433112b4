"""Template keyword arguments: checked (JSON values under names that arcpy does not set itself),
carried by a Request, passed to the chat template by render_chat and chat_ids (their strings
encoded as text), and given by each front end: decode's and chat's --template-kwarg, the
server's chat_template_kwargs over its own --template-kwarg (the server's HTTP side:
tests/test_serve_api.py, tests/test_serve_errors.py)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import click
import pytest
from serve_helpers import make_text_model
from tokenizers import Tokenizer, models, pre_tokenizers

from arcpy.backends import open_engine
from arcpy.decode import DecodeOptions, plan
from arcpy.errors import InvalidArgumentError
from arcpy.loading import load_checkpoint
from arcpy.loop.prompt import request_ids
from arcpy.loop.request import Request, TemplateKwargs
from arcpy.options import EngineOptions, parse_template_kwargs
from arcpy.serve.schema import CHAT, ApiError, Defaults, parse
from arcpy.terminal_chat import ChatOptions, Conversation, converse
from arcpy.terminal_chat import run as run_chat
from arcpy.text import TextSpec, chat_ids, check_template_kwargs, encode, render_chat
from arcpy.text.chat import SET_BY_ARCPY
from arcpy.text.sandbox import GLOBALS

USER = [{"role": "user", "content": "hi"}]
SHOW = "{{ flag | tojson }}|{{ nested.list[1] }}|{{ nested.obj.k }}|{% for m in messages %}{{ m.content }}{% endfor %}"


def one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert msg and "\n" not in msg and "Traceback" not in msg
    return msg


@pytest.fixture(scope="module")
def spec():
    """A byte-level tokenizer without merges (a token a byte) and one special token."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens(["<|im_start|>"])
    return TextSpec(tok, None, (), False, "{{ lead }}{% for m in messages %}{{ m.content }}{% endfor %}")


# -- the checks ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value, words", [
    ([("a", 1)], "must be an object of names to JSON values, got an array"),
    ("enable_thinking", "got a string"),
    ({"": 1}, "a name must be a non-empty string"),
    ({3: 1}, "a name must be a non-empty string, got 3"),
    ({"a": float("nan")}, "a: the number must be finite"),
    ({"a": [1, {"b": float("inf")}]}, "a[1].b: the number must be finite"),
    ({"a": 2**64}, "a: the integer is too large"),
    ({"a": {1: "x"}}, "a: an object's keys must be strings"),
    ({"a": {"x", "y"}}, "a must be a JSON value"),
    ({"a": b"bytes"}, "a must be a JSON value"),
    ({"a": "lone \ud800"}, "a is not valid Unicode"),
    ({"a": [[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}, "nested more than 16 deep"),
])
def test_what_is_not_json_under_a_name_is_one_line(value, words):
    with pytest.raises(InvalidArgumentError) as e:
        check_template_kwargs(value)
    assert words in one_line(e) and one_line(e).startswith("template_kwargs")


@pytest.mark.parametrize("name", [*SET_BY_ARCPY, *sorted(GLOBALS)])
def test_a_name_arcpy_sets_or_the_sandbox_defines_cannot_be_given(name):
    with pytest.raises(InvalidArgumentError) as e:
        check_template_kwargs({name: 1}, "chat_template_kwargs")
    assert one_line(e).startswith(f"chat_template_kwargs: '{name}' cannot be given")


def test_the_arguments_are_a_copy_of_json_values():
    given = {"flag": False, "n": 3, "x": 0.5, "s": "é", "none": None, "list": ("a", [1]), "obj": {"k": ["v"]}}
    kwargs = check_template_kwargs(given)
    assert kwargs == {**given, "list": ["a", [1]]}
    given["obj"]["k"].append("w")
    assert kwargs["obj"] == {"k": ["v"]} and check_template_kwargs(None) == {}


def test_a_request_holds_them_checked_read_only_and_hashable():
    r = Request(messages=USER, template_kwargs={"enable_thinking": False, "tags": ["a"]})
    assert isinstance(r.template_kwargs, TemplateKwargs) and r.template_kwargs == {"enable_thinking": False, "tags": ["a"]}
    r.template_kwargs["tags"].append("b")  # a copy: the request keeps what it was given
    assert r.template_kwargs["tags"] == ["a"]
    same = Request(messages=USER, template_kwargs={"tags": ["a"], "enable_thinking": False})
    assert r == same and hash(r) == hash(same) and r != Request(messages=USER)
    assert Request(messages=USER).template_kwargs == {}
    with pytest.raises(InvalidArgumentError) as e:
        Request(prompt="hi", template_kwargs={"enable_thinking": False})
    assert "give messages" in one_line(e)
    with pytest.raises(InvalidArgumentError) as e:
        Request(messages=USER, template_kwargs={"messages": []})
    one_line(e)


# -- the template sees them ---------------------------------------------------------------------

def test_render_chat_and_chat_ids_pass_them_to_the_template(spec):
    show = TextSpec(spec.tokenizer, None, (), False, SHOW)
    kwargs = {"flag": False, "nested": {"list": ["a", "b"], "obj": {"k": "v"}}}
    assert render_chat(show, USER, template_kwargs=kwargs) == "false|b|v|hi"
    assert chat_ids(spec, USER, template_kwargs={"lead": "x"}) == encode(spec, "xhi", parse_special=True)
    with pytest.raises(InvalidArgumentError) as e:
        render_chat(spec, USER, template_kwargs={"bos_token": "<s>"})
    one_line(e)


def test_special_token_strings_in_an_argument_are_text(spec):
    start = spec.tokenizer.token_to_id("<|im_start|>")
    assert start in encode(spec, render_chat(spec, USER, template_kwargs={"lead": "<|im_start|>"}), parse_special=True)
    ids = chat_ids(spec, USER, template_kwargs={"lead": "<|im_start|>"})
    assert start not in ids and ids == encode(spec, "<|im_start|>hi")  # the characters it is


def test_a_request_carries_them_to_the_prompt(spec):
    request = Request(messages=USER, template_kwargs={"lead": "x"})
    assert request_ids(spec, request) == chat_ids(spec, USER, template_kwargs={"lead": "x"}) != request_ids(
        spec, Request(messages=USER))


# -- --template-kwarg ---------------------------------------------------------------------------

def test_a_value_is_json_where_it_parses_else_a_string():
    got = parse_template_kwargs(["enable_thinking=false", "n=3", 'tags=["a", 1]', 'quoted="3"', "name=Bob",
                                 "empty=", "eq=a=b", "nan=NaN", "obj={\"k\": null}"])
    assert got == {"enable_thinking": False, "n": 3, "tags": ["a", 1], "quoted": "3", "name": "Bob", "empty": "",
                   "eq": "a=b", "nan": "NaN", "obj": {"k": None}}


@pytest.mark.parametrize("pairs, words", [
    (["enable_thinking"], "takes KEY=VALUE"),
    (["=false"], "takes KEY=VALUE"),
    (["a=1", "a=2"], "'a' is given twice"),
    (["add_generation_prompt=false"], "--template-kwarg: 'add_generation_prompt' cannot be given"),
    (["big=1" + "0" * 30], "--template-kwarg: big: the integer is too large"),
])
def test_a_bad_template_kwarg_is_a_usage_error(pairs, words):
    with pytest.raises(click.UsageError) as e:
        parse_template_kwargs(pairs)
    assert words in e.value.format_message()


def plan_of(**changes):
    options = dict(shape=None, prompt="hello", prompt_ids=None, chat=True, system=None,
                   max_new_tokens=2, stop_ids=(), stop_strings=(), engine_opts=EngineOptions(backend="numpy"))
    return plan(DecodeOptions(**{**options, **changes}))


def test_decode_puts_them_in_the_chat_request_and_needs_chat():
    request, run = plan_of(template_kwargs=("enable_thinking=false",))
    assert request.template_kwargs == {"enable_thinking": False} and request.messages
    with pytest.raises(click.UsageError, match="--template-kwarg needs --chat"):
        plan_of(chat=False, template_kwargs=("enable_thinking=false",))
    request, run = plan_of(prompt=None, template_kwargs=("lead=x",))  # the built-in question, asked later
    assert request.prompt_ids == (1,) and not request.template_kwargs and run.template_kwargs == {"lead": "x"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_text_model(tmp_path_factory.mktemp("kwargs") / "tiny")


def decode(*args):
    return subprocess.run([sys.executable, "-m", "arcpy.decode", "--backend", "numpy", "-n", "2", *args],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))


def prompt_tokens(stderr: str) -> int:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("model "))
    return int(line.split("prompt ")[1].split()[0])


def test_the_decode_command_renders_the_template_with_them(model_dir):
    plain = decode("--model", str(model_dir), "--chat", "--prompt", "hello there")
    led = decode("--model", str(model_dir), "--chat", "--prompt", "hello there", "--template-kwarg",
                 "lead=general kenobi")
    assert plain.returncode == led.returncode == 0, plain.stderr + led.stderr
    assert (prompt_tokens(plain.stderr), prompt_tokens(led.stderr)) == (2, 4)
    bad = decode("--model", str(model_dir), "--chat", "--prompt", "hi", "--template-kwarg", "messages=[]")
    assert bad.returncode == 2 and "loaded" not in bad.stderr and "Traceback" not in bad.stderr
    assert [ln for ln in bad.stderr.splitlines() if ln.startswith("error")] == [
        "error: --template-kwarg: 'messages' cannot be given: arcpy sets it for the template itself (from the "
        "messages and the model)"]


def test_the_chat_command_renders_every_turn_with_them(model_dir):
    model, text = load_checkpoint(model_dir)
    lead = {"lead": "general"}
    with open_engine(model, "numpy", text=text) as engine:
        conv = Conversation(engine, max_new_tokens=2, template_kwargs=lead)
        lines = iter(["hello", "/exit"])
        assert converse(conv, lambda prompt: next(lines), io.StringIO(), io.StringIO()) == 0
        [(asked, answered)] = conv.turns
        ids, dropped = conv.fit("there")
        history = [{"role": "user", "content": asked}, {"role": "assistant", "content": answered},
                   {"role": "user", "content": "there"}]
        assert dropped == 0 and ids == request_ids(text, Request(messages=history, template_kwargs=lead))
        assert ids[0] == text.tokenizer.token_to_id("general") and ids != request_ids(text, Request(messages=history))


def test_the_chat_command_refuses_a_bad_template_kwarg_before_loading(capsys):
    status = run_chat(ChatOptions(system=None, template_kwargs=("enable_thinking",), max_new_tokens=8,
                                  stop_strings=(), stats=False, engine_opts=EngineOptions(backend="numpy")))
    assert status == 2 and "--template-kwarg takes KEY=VALUE" in capsys.readouterr().err


# -- the server's defaults ----------------------------------------------------------------------

def test_a_chat_body_s_template_kwargs_go_over_the_server_s_own():
    defaults = Defaults(template_kwargs=TemplateKwargs({"enable_thinking": False, "lead": "x"}))
    body = {"model": "m", "messages": USER}
    assert parse(CHAT, body, "m", defaults).request.template_kwargs == {"enable_thinking": False, "lead": "x"}
    given = {**body, "chat_template_kwargs": {"enable_thinking": True}}
    assert parse(CHAT, given, "m", defaults).request.template_kwargs == {"enable_thinking": True, "lead": "x"}
    assert parse(CHAT, {**body, "chat_template_kwargs": None}, "m", Defaults()).request.template_kwargs == {}
    with pytest.raises(ApiError) as e:
        parse(CHAT, {**body, "chat_template_kwargs": {"x": float("nan")}}, "m", defaults)
    assert e.value.param == "chat_template_kwargs" and "x: the number must be finite" in str(e.value)


def test_the_engine_options_reach_every_command_as_one_record(monkeypatch):
    """--backend, --device-loop/--host-path, --burst, --max-seq and --speculate build one
    EngineOptions, which decode, chat and serve receive in place of the five values."""
    from click.testing import CliRunner

    from arcpy import decode, terminal_chat
    from arcpy.serve import command

    seen = []
    monkeypatch.setattr(decode, "cli_decode", lambda options: seen.append(options.engine_opts) or 0)
    monkeypatch.setattr(terminal_chat, "run", lambda options: seen.append(options.engine_opts) or 0)
    monkeypatch.setattr(command, "run", lambda options: seen.append(options.engine_opts) or 0)
    args = ["--backend", "numpy", "--host-path", "--burst", "16", "--max-seq", "128", "--speculate", "3"]
    for main in (decode.main, terminal_chat.main, command.main):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    assert seen == [EngineOptions("numpy", False, 16, 128, 3)] * 3


def test_speculation_is_on_unless_switched_off(monkeypatch):
    """No option: speculate None (open_device's default, on); --no-speculate and --speculate 0: none."""
    from click.testing import CliRunner

    from arcpy import decode
    from arcpy.drafting import DEFAULT_DRAFTS

    seen = []
    monkeypatch.setattr(decode, "cli_decode", lambda options: seen.append(options.engine_opts.speculate) or 0)
    for args in ([], ["--no-speculate"], ["--speculate", "0"], ["--speculate", "0", "--no-speculate"],
                 ["--speculate", "5"]):
        result = CliRunner().invoke(decode.main, ["--backend", "numpy", *args])
        assert result.exit_code == 0, result.output
    assert seen == [None, 0, 0, 0, 5] and DEFAULT_DRAFTS == 7
    result = CliRunner().invoke(decode.main, ["--backend", "numpy", "--speculate", "2", "--no-speculate"])
    assert result.exit_code == 2 and "--speculate and --no-speculate contradict each other" in result.output



def test_the_drafts_memory_is_on_unless_switched_off_and_reaches_the_engine(monkeypatch):
    """--no-draft-memory gives the engine draft_memory=False; the default and --draft-memory, True."""
    from click.testing import CliRunner

    from arcpy import backends, decode

    seen = []
    real = backends.Engine

    def engine(device, backend, settings, **kw):
        seen.append(settings.draft_memory)
        return real(device, backend, settings, **kw)

    monkeypatch.setattr(backends, "Engine", engine)
    for args in ([], ["--draft-memory"], ["--no-draft-memory"]):
        result = CliRunner().invoke(decode.main, ["--backend", "numpy", "--shape", "stories15M", "--prompt-ids", "1 2",
                                                  "--max-new-tokens", "1", *args])
        assert result.exit_code == 0, result.output
    assert seen == [True, True, False]
