"""Measuring the server from outside, as its clients meet it: `arcpy serve` in a child process,
and a streaming client (the standard library's http.client, nothing between it and the socket)
that stamps each part of an answer as it arrives. scripts/server_overhead.py, scripts/load_test.py
and the server's tests use it.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import arcpy

# The package this process imports goes first on the child's path: the server runs the same code.
PACKAGE_ROOT = str(Path(arcpy.__file__).resolve().parent.parent)
_LISTENING = re.compile(r"on (http://[^/\s]+)/v1 ")


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ, **(extra or {}))
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + rest)
    return env


class ServerProcess:
    """`python -m arcpy.serve --port 0 ARGS` until stop(): ready once /health answers 200. `url`
    is its base URL; `log` what it wrote (stdout and stderr, in a file)."""

    def __init__(self, args, env: dict | None = None, ready_timeout: float = 300.0):
        self._log = tempfile.NamedTemporaryFile("w+", prefix="arcpy-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "arcpy.serve", "--port", "0", *args],
                                     stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=child_env(env))
        self.url = self._wait_ready(ready_timeout)

    @property
    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        url = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode}:\n{self.log}")
            if url is None:
                found = _LISTENING.search(self.log)
                url = found.group(1) if found else None
            if url is not None and get(url + "/health", timeout=2)[0] == 200:
                return url
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the server was not ready in {timeout:g} s:\n{self.log}")

    def rss_kib(self) -> int:
        """The server's resident memory (VmRSS of /proc/<pid>/status)."""
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
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        self._log.close()
        os.unlink(self._log.name)


def connection(url: str, timeout: float = 600.0) -> http.client.HTTPConnection:
    """A connection to `url`'s host and port (kept alive across requests as stream_chat's `conn`)."""
    parts = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def _request(method: str, url: str, timeout: float, body: bytes | None = None, headers=None) -> tuple[int, str]:
    conn = connection(url, timeout)
    try:
        conn.request(method, urllib.parse.urlsplit(url).path, body, headers or {})
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    except OSError:
        return 0, ""
    finally:
        conn.close()


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answers."""
    return _request("GET", url, timeout)


def post(url: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int, str]:
    """(status, body) of a POST of JSON `body`; status 0 when nothing answers."""
    return _request("POST", url, timeout, json.dumps(body or {}).encode(), {"content-type": "application/json"})


def metric(url: str, name: str) -> float:
    """One sample of the server's /metrics (0 where it has none yet)."""
    found = re.search(rf"^{re.escape(name)} (\S+)$", get(url + "/metrics")[1], re.M)
    return float(found.group(1)) if found else 0.0


@dataclass
class Streamed:
    """One streamed chat completion, as the client saw it (perf_counter seconds)."""

    status: int = 0
    text: str = ""
    sent: float = 0.0
    stamps: list[float] = field(default_factory=list)  # one per chunk that carried text
    tokens: int = 0                # the usage's completion_tokens
    prompt_tokens: int = 0
    cached_tokens: int = 0         # the usage's prompt_tokens_details.cached_tokens
    finish_reason: str | None = None
    error: str | None = None       # the error's message: a status other than 200, or an error event
    hung_up: bool = False          # the client left before the end
    done: bool = False             # [DONE] came

    @property
    def ttft(self) -> float | None:
        return self.stamps[0] - self.sent if self.stamps else None

    @property
    def decode_rate(self) -> float | None:
        """Tokens after the first per second, between the first and the last chunk with text."""
        if len(self.stamps) < 2 or self.tokens < 2:
            return None
        return (self.tokens - 1) / (self.stamps[-1] - self.stamps[0])


def stream_chat(url: str, body: dict, hang_up_after: int | None = None, conn=None, timeout: float = 600.0,
                on_first=None) -> Streamed:
    """POST `body` to /v1/chat/completions with streaming and usage; read the events as they come.
    With `hang_up_after`, close the connection after that many chunks with text. `conn`, an open
    HTTPConnection, is reused (kept alive) where the answer ended normally. `on_first()` is called
    as the first text arrives."""
    own = conn is None
    conn = conn or connection(url, timeout)
    out = Streamed()
    data = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
    try:
        out.sent = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", data, {"content-type": "application/json"})
        r = conn.getresponse()
        out.status = r.status
        if r.status != 200:
            out.error = _message(r.read())
            return out
        for line in r:
            if not line.startswith(b"data: "):
                continue
            if line.startswith(b"data: [DONE]"):
                out.done = True
                break
            event = json.loads(line[6:])
            if "error" in event:
                out.error = event["error"]["message"]
                break
            if event.get("usage"):
                out.tokens, out.prompt_tokens = event["usage"]["completion_tokens"], event["usage"]["prompt_tokens"]
                out.cached_tokens = (event["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            for choice in event.get("choices", []):
                text = choice["delta"].get("content")
                if text:
                    out.stamps.append(time.perf_counter())
                    out.text += text
                    if len(out.stamps) == 1 and on_first is not None:
                        on_first()
                out.finish_reason = choice.get("finish_reason") or out.finish_reason
            if hang_up_after is not None and len(out.stamps) >= hang_up_after:
                out.hung_up = True
                conn.close()
                break
        if out.done:
            r.read()  # the end of the chunked body, so that the connection can carry the next request
    finally:
        if own or out.hung_up or not out.done:
            conn.close()
    return out


def _message(body: bytes) -> str:
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:200]
