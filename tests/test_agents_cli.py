"""Agents on the command line: `arcpy chat --tools` shows a call and its arguments and takes the
tool's result with /tool; `arcpy generate --json-schema FILE` answers JSON valid by the schema."""

from __future__ import annotations

import io
import json

import jsonschema
from agent_helpers import QWEN3, family_text, typist_engine
from click.testing import CliRunner
from llamacpp_sdist import llamacpp_models
from test_agents_serve import FINAL, WEATHER, script

from arcpy.cli import main as cli
from arcpy.terminal_chat import Conversation, converse


def test_chat_shows_a_tool_call_and_takes_its_result():
    text = family_text((llamacpp_models() / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text())
    engine = typist_engine(text, script)
    conversation = Conversation(engine, tools=[WEATHER])
    lines = iter(["What is the weather in Paris?", '/tool {"temperature": 18}', "/exit"])
    out, err = io.StringIO(), io.StringIO()
    assert converse(conversation, lambda prompt: next(lines), out=out, err=err) == 0
    shown = out.getvalue()
    assert '[tool call get_weather] {"city": "Paris", "unit": "celsius"}' in shown
    assert "<tool_call>" not in shown and FINAL in shown
    assert shown.index("[tool call") < shown.index(FINAL)
    # The result went back as the tool's turn, answering the call by its id.
    (asked, messages), = conversation.turns
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    assert messages[1]["tool_call_id"] == messages[0]["tool_calls"][0]["id"]
    assert "<tool_response>\n{\"temperature\": 18}\n</tool_response>" in engine.device.prompts[-1]
    assert "error: no tool call is waiting" not in err.getvalue()
    # A result with no call waiting is one line, and the session goes on.
    lines = iter(['/tool {"x": 1}', "/exit"])
    converse(conversation, lambda prompt: next(lines), out=out, err=err)
    assert "error: no tool call is waiting for a result" in err.getvalue()


def test_generate_with_a_json_schema_file(tmp_path):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    r = CliRunner().invoke(cli, ["generate", "--model", str(QWEN3), "--prompt", "hello there",
                                 "--json-schema", str(path), "-n", "40", "--temperature", "1", "--seed", "3"])
    assert r.exit_code == 0, r.output
    jsonschema.validate(json.loads(r.stdout.strip()), schema)


def test_a_bad_schema_file_is_one_line(tmp_path):
    for content, words in [('{"type": "objekt"}', "not valid"), ("{nope", "JSON schema")]:
        path = tmp_path / "schema.json"
        path.write_text(content)
        r = CliRunner().invoke(cli, ["generate", "--model", str(QWEN3), "--prompt", "hello",
                                     "--json-schema", str(path), "-n", "4"])
        assert r.exit_code != 0 and words in r.stderr, r.output
        assert len([line for line in r.stderr.splitlines() if line.startswith("error")]) == 1
    r = CliRunner().invoke(cli, ["generate", "--shape", "stories15M", "--prompt-ids", "1", "--json-schema",
                                 str(path)])
    assert r.exit_code == 2 and "--json-schema needs a model with a tokenizer" in r.stderr


def errors_of(r) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("error")]


def test_a_missing_file_argument_is_one_line(tmp_path):
    for args, words in [(["generate", "--model", str(QWEN3), "--json-schema", "/no/file.json", "-n", "3"],
                         "error: --json-schema: /no/file.json: cannot read (No such file or directory)"),
                        (["chat", "--model", str(QWEN3), "--tools", "/no/tools.json"],
                         "error: --tools: /no/tools.json: cannot read (No such file or directory)")]:
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2 and not isinstance(r.exception, OSError), (r.exception, r.output)
        assert errors_of(r) == [words] and "loaded " not in r.stderr, r.output


def test_a_file_argument_and_the_schema_are_checked_before_the_model_loads(tmp_path):
    schema, tools = tmp_path / "schema.json", tmp_path / "tools.json"
    schema.write_text('{"type": "objekt"}')
    tools.write_text('{"type": "function"}')
    for args, words in [(["generate", "--model", str(QWEN3), "--prompt", "hi", "--json-schema", str(schema)],
                         "error: --json-schema: the JSON schema is not valid"),
                        (["chat", "--model", str(QWEN3), "--tools", str(tools)], "error: --tools: tools must be")]:
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2 and "loaded " not in r.stderr, r.output
        assert len(errors_of(r)) == 1 and errors_of(r)[0].startswith(words), r.output
