"""What the server's tests share: a small model with a tokenizer, and `arcpy serve` in a subprocess
on a free port, ready once /health answers."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

import arcpy
from arcpy.model import SHAPES, random_model, save_model

WORDS = ["?", "hello", "there", "general", "kenobi", "END"] + [f"w{i}" for i in range(58)]
# The package the tests import, first on the server's path: the server runs the same code.
PACKAGE_ROOT = str(Path(arcpy.__file__).resolve().parent.parent)


def make_text_model(d: Path, shape: str = "qwen-tiny", seed: int = 5, eos: str = "END", **changes) -> Path:
    """A model directory with random weights, a word-level tokenizer.json (WORDS, then x<i>), `eos`
    its end-of-sequence token, and a chat template that writes each message's content and a space."""
    cfg = dataclasses.replace(SHAPES[shape], **changes)
    save_model(random_model(cfg, seed=seed, name=d.name), d)
    vocab = {w: i for i, w in enumerate(WORDS)}
    vocab.update({f"x{i}": i for i in range(len(WORDS), cfg.vocab)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens([eos])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": eos, "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}))
    return d


def server_env(extra: dict | None = None) -> dict:
    env = dict(os.environ, **(extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


class Server:
    """`python -m arcpy.serve --port 0 ARGS` until stop(); .url is its base URL, .log what it wrote."""

    def __init__(self, *args, env: dict | None = None, ready_timeout: float = 180.0):
        self._log = tempfile.NamedTemporaryFile("w+", prefix="arcpy-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "arcpy.serve", "--port", "0", *args],
                                     stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=server_env(env))
        self.url = self._wait_ready(ready_timeout)

    @property
    def log(self) -> str:
        return Path(self._log.name).read_text()

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        url = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log}")
            if url is None:
                found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", self.log)
                url = found.group(1) if found else None
            if url is not None:
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        return url
                except httpx.TransportError:
                    pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the server was not ready in {timeout} s:\n{self.log}")

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        os.unlink(self._log.name)
