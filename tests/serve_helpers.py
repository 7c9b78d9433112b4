"""What the server's tests share: a small model with a tokenizer, `arcpy serve` in a subprocess
on a free port, ready once /health answers (arcpy.bench.http_client), the `openai` client of a server,
an engine of its own to answer alike, and the fixtures of a tiny model's server."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from pathlib import Path

import openai
import pytest
import uvicorn

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from arcpy.backends import open_engine
from arcpy.bench.http_client import ServerProcess, child_env
from arcpy.loading import load_checkpoint
from arcpy.loop.engine import Engine
from arcpy.model import SHAPES, random_model, save_model

server_env = child_env

WORDS = ["?", "hello", "there", "general", "kenobi", "END"] + [f"w{i}" for i in range(58)]
LEAD_TEMPLATE = "{% if lead is defined %}{{ lead }} {% endif %}{% for m in messages %}{{ m['content'] }} {% endfor %}"


def make_text_model(d: Path, shape: str = "qwen-tiny", seed: int = 5, eos: str = "END", words=(),
                    **changes) -> Path:
    """A model directory with random weights, a word-level tokenizer.json (WORDS, `words`, then
    x<i>), `eos` its end-of-sequence token, and a chat template that writes each message's content
    and a space, after the template keyword argument `lead` and a space where it is given."""
    cfg = dataclasses.replace(SHAPES[shape], **changes)
    save_model(random_model(cfg, seed=seed, name=d.name), d)
    vocab = {w: i for i, w in enumerate(dict.fromkeys([*WORDS, *words]))}
    vocab.update({f"x{i}": i for i in range(len(vocab), cfg.vocab)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens([eos])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": eos, "chat_template": LEAD_TEMPLATE}))
    return d


def Server(*args, env: dict | None = None, ready_timeout: float = 180.0) -> ServerProcess:
    """`python -m arcpy.serve --port 0 ARGS`, ready once /health answers."""
    return ServerProcess(args, env=env, ready_timeout=ready_timeout)


def client_of(server, api_key: str = "unused") -> openai.OpenAI:
    """The `openai` client of a server, with no retries: a test sees the first answer."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0)


def engine_alone(model_dir: Path, **kw) -> Engine:
    """An engine of its own over the model of `model_dir`, on the NumPy backend: what a server
    of that model must answer alike."""
    model, text = load_checkpoint(model_dir)
    return open_engine(model, "numpy", text=text, **kw)


# The fixtures of a test module that talks to a tiny model's server (the module imports them by
# name): the model directory, the server on the NumPy backend (greedy by default), its client.

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_text_model(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="module")
def server(model_dir):
    with Server("--model", str(model_dir), "--backend", "numpy", "--temperature", "0") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return client_of(server)


class InProcess:
    """The app on uvicorn in a thread of this process, on a free port."""

    def __init__(self, app):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)
