"""A Hugging Face hub cache laid out by hand, and a stand-in hub on 127.0.0.1, for the tests of
models by name: nothing here reaches the network.

The cache is the hub's own layout (models--org--name/blobs/<sha256>, snapshots/<commit>/<file> as a
link to its blob, refs/<revision> holding the commit); `cache_repo` checks it with huggingface_hub's
own scan_cache_dir. `FakeHub` answers the few requests huggingface_hub makes to resolve and fetch a
model: a repository's info, its file tree, and a file's metadata and bytes."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

FAMILY = Path(__file__).resolve().parent / "data" / "families" / "qwen3"
HF_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def commit_of(repo: str, revision: str = "main") -> str:
    return hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()


def cache_repo(cache: Path, repo: str, files: dict[str, Path], revision: str = "main") -> Path:
    """`files` (name in the repository -> a file to copy) as the hub caches them; the snapshot folder."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.file_download import repo_folder_name

    top = Path(cache) / repo_folder_name(repo_id=repo, repo_type="model")
    commit = commit_of(repo, revision)
    for name, source in files.items():
        data = Path(source).read_bytes()
        blob = top / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = top / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (top / "refs").mkdir(exist_ok=True)
    (top / "refs" / revision).write_text(commit)
    # The hub's own reading of the cache finds the repository, its revision and every file.
    [seen] = [r for r in scan_cache_dir(cache).repos if r.repo_id == repo]
    assert revision in seen.refs and {f.file_name for f in seen.refs[revision].files} >= {
        n.rsplit("/", 1)[-1] for n in files}
    return top / "snapshots" / commit


def hf_repo(cache: Path, repo: str = "tiny/qwen3", revision: str = "main") -> Path:
    """The qwen3 fixture as a Hugging Face (safetensors) repository in the cache."""
    return cache_repo(cache, repo, {n: FAMILY / n for n in HF_FILES}, revision)


def gguf_repo(cache: Path, repo: str = "tiny/qwen3-GGUF", quants=("BF16", "Q8_0")) -> Path:
    """The qwen3 fixture as a GGUF repository in the cache: one file per quantization."""
    source = {"BF16": FAMILY / "model.gguf", "Q8_0": FAMILY / "model-q8_0.gguf"}
    return cache_repo(cache, repo, {f"qwen3-{q}.gguf": source[q] for q in quants})


class FakeHub:
    """A stand-in for the hub's HTTP API on 127.0.0.1 (HF_ENDPOINT=hub.url): `repos` maps a
    repository to {file name: bytes}; `gated` names repositories that answer 403 GatedRepo. Every
    request's path and Authorization header is kept in `requests`."""

    def __init__(self, repos: dict[str, dict[str, bytes]], gated=()):
        self.repos, self.gated, self.requests = repos, set(gated), []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.answer(self, body=False)

            def do_GET(self):
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append((h.command, path, h.headers.get("Authorization")))
        parts = path.strip("/").split("/")
        api = parts[0] == "api" and parts[1:2] == ["models"]
        repo = "/".join(parts[2:4] if api else parts[0:2])
        if repo not in self.repos:
            return self.send(h, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, body)
        if repo in self.gated and not api:
            return self.send(h, 403, b'{"error": "gated"}', {"X-Error-Code": "GatedRepo",
                                                            "X-Error-Message": "Access to this model is restricted"}, body)
        files, rest = self.repos[repo], parts[4:] if api else parts[2:]
        commit = commit_of(repo)
        if api and (not rest or rest[0] == "revision"):
            doc = {"id": repo, "sha": commit, "siblings": [{"rfilename": f} for f in sorted(files)]}
            return self.send(h, 200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, body)
        if api and rest[0] == "tree":
            doc = [{"type": "file", "path": f, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                   for f, data in sorted(files.items())]
            return self.send(h, 200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, body)
        name = "/".join(rest[2:]) if rest[:1] == ["resolve"] else None
        if name not in files:
            return self.send(h, 404, b"{}", {"X-Error-Code": "EntryNotFound"}, body)
        data = files[name]
        return self.send(h, 200, data, {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'},
                         body)

    @staticmethod
    def send(h: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict, body: bool) -> None:
        h.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            h.send_header(key, value)
        h.end_headers()
        if body:
            h.wfile.write(data)
