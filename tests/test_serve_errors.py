"""Every client mistake is one clear error in OpenAI's shape with its own status, never a 500:
malformed JSON and fields (400), a prompt longer than the context (400, with the numbers), an
unknown model (404), a missing or wrong API key (401), a body over the limit (413), an unknown
route (404) or method (405)."""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys

import httpx
import openai
import pytest
from serve_helpers import Server, client_of, make_text_model, server_env

from arcpy.model import SHAPES, random_model, save_model

KEY = "sekret-key"
MAX_BODY = 4096
AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1}
COMPLETION = {"model": "tiny", "prompt": "hello", "max_tokens": 1}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = make_text_model(tmp_path_factory.mktemp("errors") / "tiny")
    with Server("--model", str(d), "--backend", "numpy", "--api-key", KEY, "--max-body", str(MAX_BODY),
                "--max-seq", "64") as s:
        yield s


def post(server, path, body=None, headers=AUTH, **kw) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60, **kw)


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error


@pytest.mark.parametrize("change, param, words", [
    ({"temperature": "hot"}, "temperature", "must be a number"),
    ({"temperature": 3}, "temperature", "in [0, 2]"),
    ({"top_p": 0}, "top_p", "(0, 1]"),
    ({"top_k": -3}, "top_k", "top_k"),
    ({"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"max_tokens": 5, "max_completion_tokens": 6}, "max_tokens", "disagree"),
    ({"seed": 2**70}, "seed", "64-bit"),
    ({"n": 2}, "n", "n must be 1"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"stop": [""]}, "stop", "must not be empty"),
    ({"stream": "yes"}, "stream", "true or false"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when stream is true"),
    ({"logprobs": "yes"}, "logprobs", "true or false"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "0..20"),
    ({"top_logprobs": 3}, "top_logprobs", "needs logprobs to be true"),
    ({"stream": True, "stream_options": {"continuous_usage_stats": 1}}, "continuous_usage_stats", "true or false"),
    ({"frequency_penalty": 0.5}, "frequency_penalty", "not supported"),
    ({"colour": "blue"}, "colour", "unrecognized request argument"),
    ({"messages": []}, "messages", "non-empty array"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "unknown role 'wizard'"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "string or an array of text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content", "only text parts"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}, "messages[0].tool_calls",
     "only an assistant"),
    ({"messages": [{"role": "user", "content": "hi", "tool_call_id": "c"}]}, "messages[0].tool_call_id",
     "only a tool message"),
    ({"messages": [{"role": "user", "content": "hi", "audio": {}}]}, "messages[0].audio", "unsupported"),
    ({"chat_template_kwargs": ["lead"]}, "chat_template_kwargs", "must be an object, got an array"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs", "arcpy sets it"),
    ({"chat_template_kwargs": {"raise_exception": 1}}, "chat_template_kwargs", "function the template sandbox"),
    ({"chat_template_kwargs": {"lead": {"x": [2**70]}}}, "chat_template_kwargs", "lead.x[0]: the integer is too large"),
])
def test_a_malformed_field_is_a_400_that_names_it(server, change, param, words):
    error = error_of(post(server, "/v1/chat/completions", {**CHAT, **change}), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param and words in error["message"], error


def test_a_lone_surrogate_in_a_message_is_a_400(server):
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "bad \\ud800 text"}]}'
    r = httpx.post(server.url + "/v1/chat/completions", content=body, headers=AUTH, timeout=60)
    assert "not valid UTF-8: character 4" in error_of(r, 400)["message"]


@pytest.mark.parametrize("body, param", [
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "x\\ud800": 1}', "x\\ud800"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi", "\\udfff": 1}]}', "messages[0].\\udfff"),
], ids=["top level", "in a message"])
def test_a_lone_surrogate_in_an_unknown_fields_name_is_a_400_naming_it_escaped(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", content=body, headers=AUTH, timeout=60)
    error = error_of(r, 400)
    assert error["param"] == param and param.rpartition(".")[2] in error["message"], error


@pytest.mark.parametrize("stop", ['"a\\ud800"', '["ok", "b\\udc00"]'])
def test_a_lone_surrogate_in_a_stop_string_is_a_400(server, stop):
    body = b'{"model": "tiny", "prompt": "hello", "max_tokens": 1, "stop": ' + stop.encode() + b"}"
    r = httpx.post(server.url + "/v1/completions", content=body, headers=AUTH, timeout=60)
    assert "is not valid UTF-8: character 1" in error_of(r, 400)["message"]


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", {**COMPLETION, "max_tokens": 2**64}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 64}, "max_tokens"),
    ("/v1/chat/completions", {"model": "tiny", "messages": CHAT["messages"], "max_completion_tokens": 10**6},
     "max_completion_tokens"),
])
def test_a_budget_beyond_the_context_is_a_400_naming_both_numbers(server, path, body, field):
    error = error_of(post(server, path, body), 400)
    prompt = post(server, path, {**body, field: 1}).json()["usage"]["prompt_tokens"]
    assert error["param"] == field and error["code"] == "context_length_exceeded"
    # A larger --max-seq helps only where the model's own context (512) holds the prompt and the budget.
    fix = ("the server's --max-seq sets it (the model allows up to 512)" if prompt + body[field] <= 512
           else "ask for fewer or shorten the prompt (the model's own context is 512 positions)")
    assert error["message"] == (f"{field} is {body[field]}, but the context holds 64 positions and the prompt takes "
                                f"{prompt}: at most {64 - prompt} new tokens fit; {fix}")
    fits = post(server, path, {**body, field: 64 - prompt})
    assert fits.status_code == 200, fits.text


@pytest.mark.parametrize("prompt, words", [
    (["one", "two"], "one prompt per request"),
    ([1, 2, 9999], "token id 9999 is outside the vocabulary [0, 512)"),
    ("", "prompt is empty"),
    (None, "prompt: required"),
])
def test_a_bad_completion_prompt_is_a_400(server, prompt, words):
    error = error_of(post(server, "/v1/completions", {**COMPLETION, "prompt": prompt}), 400)
    assert words in error["message"], error


def test_template_kwargs_are_for_chat_completions_only(server):
    error = error_of(post(server, "/v1/completions", {**COMPLETION, "chat_template_kwargs": {"lead": "hello"}}), 400)
    assert error["param"] == "chat_template_kwargs" and "unrecognized request argument" in error["message"], error


@pytest.mark.parametrize("body", [b"{not json", b"", b"[1, 2]", b"\xff\xfe", b"[" * 100_000 + b"]" * 100_000])
def test_a_body_that_is_not_a_json_object_is_a_400(server, body):
    r = httpx.post(server.url + "/v1/chat/completions", content=body[:MAX_BODY], headers=AUTH, timeout=60)
    assert error_of(r, 400)["type"] == "invalid_request_error"


def test_a_prompt_longer_than_the_context_is_a_400_with_the_numbers(server):
    long = " ".join(["hello"] * 80)
    error = error_of(post(server, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": long}]}),
                     400)
    assert "the prompt has 80 tokens, but the context holds 64 positions" in error["message"]
    assert "the server's --max-seq sets it (the model allows up to 512)" in error["message"]
    assert error["code"] == "context_length_exceeded"


def test_a_prompt_longer_than_the_model_s_own_context_is_told_to_be_shorter(server):
    long = " ".join(["hello"] * 600)  # the model's own context is 512: no --max-seq can hold it
    error = error_of(post(server, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": long}]}),
                     400)
    assert "the prompt has 600 tokens, but the context holds 64 positions" in error["message"]
    assert error["message"].endswith(": shorten the prompt (the model's own context is 512 positions)"), error
    assert "--max-seq" not in error["message"] and error["code"] == "context_length_exceeded"


def test_an_unknown_model_is_a_404(server):
    error = error_of(post(server, "/v1/chat/completions", {**CHAT, "model": "gpt-9"}), 404)
    assert error["code"] == "model_not_found" and "'gpt-9'" in error["message"] and "'tiny'" in error["message"]
    assert error_of(httpx.get(server.url + "/v1/models/gpt-9", headers=AUTH), 404)["code"] == "model_not_found"


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"authorization": KEY},
                                     {"authorization": "Basic dXNlcjpwYXNz"}])
def test_a_missing_or_wrong_api_key_is_a_401(server, headers):
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        assert error_of(post(server, path, body, headers=headers), 401)["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/v1/models", headers=headers).status_code == 401


def test_the_right_api_key_is_served_and_health_needs_none(server):
    assert post(server, "/v1/chat/completions", CHAT).status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200


def test_the_openai_client_raises_its_own_errors(server):
    good = client_of(server, KEY)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        good.chat.completions.create(model="tiny", messages=CHAT["messages"], n=3)
    with pytest.raises(openai.NotFoundError):
        good.chat.completions.create(model="other", messages=CHAT["messages"])
    with pytest.raises(openai.AuthenticationError):
        client_of(server, "nope").models.list()


def test_a_body_over_the_limit_is_a_413_whether_its_length_is_told_or_not(server):
    big = {**CHAT, "messages": [{"role": "user", "content": "hello " * MAX_BODY}]}
    assert error_of(post(server, "/v1/chat/completions", big), 413)["code"] == "request_too_large"

    def chunked():  # no Content-Length: the limit holds as the body is read
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(MAX_BODY // 64 + 2):
            yield b"hello " * 10 + b"    "
        yield b'"}]}'

    r = httpx.post(server.url + "/v1/chat/completions", content=chunked(), headers=AUTH, timeout=60)
    assert error_of(r, 413)["code"] == "request_too_large"


def test_an_unknown_route_or_method_is_an_error_in_the_same_shape(server):
    assert error_of(httpx.get(server.url + "/v1/engines", headers=AUTH), 404)["code"] == "not_found"
    assert error_of(httpx.get(server.url + "/v1/chat/completions", headers=AUTH), 405)


VALUES = [None, True, -1, 0, 1e300, "x", [], {}, [1, "a"], {"a": 1}]
FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
          "stop", "n", "stream", "stream_options", "logprobs", "tools", "user", "logit_bias", "response_format"]


def test_no_field_value_makes_a_500(server):
    statuses = set()
    for name, value in itertools.product(FIELDS, VALUES):
        body = {**CHAT, name: value}
        if body.get("stream") is True:
            body["stream_options"] = None
        r = post(server, "/v1/chat/completions", body)
        assert r.status_code in (200, 400, 404), (name, value, r.text)
        statuses.add(r.status_code)
        if r.status_code != 200:
            error_of(r, r.status_code)
    assert statuses == {200, 400, 404}
    for name, value in itertools.product(["prompt", "echo", "best_of", "suffix", "logprobs"], VALUES):
        r = post(server, "/v1/completions", {**COMPLETION, name: value})
        assert r.status_code in (200, 400), (name, value, r.text)


def serve(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "arcpy.serve", *args], capture_output=True, text=True,
                          env=server_env(), stdin=subprocess.DEVNULL, timeout=timeout)


def test_a_busy_port_is_one_line_before_the_model_loads(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = serve("--model", str(tmp_path), "--port", str(port))
    assert out.returncode == 1 and "loaded" not in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.strip() == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"


@pytest.mark.parametrize("args, message", [
    (["--model", "/nonexistent/m.gguf"], "error: --model /nonexistent/m.gguf: no such file or directory"),
    (["--api-key", " "], "error: --api-key is empty"),
    (["--max-queue", "-1"], "Invalid value for '--max-queue'"),
    (["--host", "no-such-host.invalid"], "error: --host no-such-host.invalid:"),
    (["--template-kwarg", "enable_thinking"], "--template-kwarg takes KEY=VALUE"),
    (["--template-kwarg", "messages=[]"], "--template-kwarg: 'messages' cannot be given"),
])
def test_a_bad_flag_is_one_line(tmp_path, args, message):
    out = serve(*(["--model", str(tmp_path)] if "--model" not in args else []), "--port", "0", *args)
    assert out.returncode in (1, 2) and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len([line for line in out.stderr.splitlines() if line.lower().startswith("error")]) == 1


def test_a_model_without_a_tokenizer_is_refused(tmp_path):
    save_model(random_model(SHAPES["qwen-tiny"], seed=5, name="ids-only"), tmp_path)
    out = serve("--model", str(tmp_path), "--port", "0", "--backend", "numpy")
    assert out.returncode == 2 and "has no tokenizer (tokenizer.json)" in out.stderr and "Traceback" not in out.stderr
