"""Models by name on the Hugging Face hub, resolved to files on this machine.

    org/name             a repository of config.json and safetensors weights
    org/name:QUANT       a repository of GGUF files: the one of that quantization (Q4_K_M, Q8_0, ...)
    org/name/FILE.gguf   that file of a repository
    org/name             a repository of GGUF files holding one model file: that file

Everything goes through huggingface_hub: its cache (HF_HUB_CACHE, or HF_HOME's), its offline mode
(HF_HUB_OFFLINE), its token (HF_TOKEN, or a login) and endpoint (HF_ENDPOINT), its progress bars
(HF_HUB_DISABLE_PROGRESS_BARS). Only the files arcpy reads are fetched: the config, tokenizer and
template files and the safetensors weights (the index's shards), or the one GGUF file. Offline,
or where the hub cannot be reached, the name resolves from the cache alone. A name that is a path
on this machine is that path, never looked up. Every failure is one ModelFileError line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from arcpy.checks import quoted
from arcpy.errors import ModelFileError
from arcpy.files import read_json_file

GGUF_SUFFIX = ".gguf"
# The files of a Hugging Face model repository that arcpy reads, beside the weights.
TEXT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "chat_template.jinja")
SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
NAME_HELP = "org/name (safetensors), org/name:QUANT or org/name/FILE.gguf (GGUF) of the Hugging Face hub"
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_QUANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*")
_MAX_LISTED = 12


@dataclass(frozen=True)
class HubName:
    """A model named on the hub: its repository, and the GGUF quantization or file it picks."""

    repo: str
    quant: str | None = None
    file: str | None = None

    def __str__(self) -> str:
        return self.repo + (f":{self.quant}" if self.quant else "") + (f"/{self.file}" if self.file else "")


def parse_name(text: str) -> HubName | None:
    """The hub name `text` spells (module docstring), or None where it spells none."""
    if not isinstance(text, str) or text.startswith(("/", ".", "~")) or "\\" in text:
        return None
    parts = text.split("/")
    quant = file = None
    if len(parts) > 2:
        file = "/".join(parts[2:])
        if not file.endswith(GGUF_SUFFIX) or not all(_PART.fullmatch(p) for p in parts[2:]):
            return None
        parts = parts[:2]
    elif len(parts) == 2 and ":" in parts[1]:
        parts[1], quant = parts[1].split(":", 1)
        if not _QUANT.fullmatch(quant):
            return None
    if len(parts) != 2 or not all(_PART.fullmatch(p) and ".." not in p and "--" not in p for p in parts):
        return None
    return HubName("/".join(parts), quant, file)


def no_such_model(text: str) -> str:
    """The one line for a --model that is neither a path here nor a name of the hub."""
    if text.startswith(("/", ".", "~")):
        return f"{text}: no such file or directory"
    return f"{text}: no such file or directory, nor a name {NAME_HELP}"


def is_model_name(text: str) -> bool:
    """A path on this machine, or a name on the hub: what --model takes."""
    return os.path.exists(text) or parse_name(text) is not None


@dataclass(frozen=True)
class Resolved:
    """Where a model named on the hub lies on this machine: a .gguf file or a model folder."""

    path: str
    name: str | None          # the name as given on the hub (what the model is called); None for a path here
    note: str | None = None   # something the user is owed (the hub was unreachable: the cache was used)


def _listed(names) -> str:
    names = sorted(names)
    more = f", and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else ""
    return ", ".join(names[:_MAX_LISTED]) + more


def _quant_pattern(quant: str) -> re.Pattern:
    # The quantization as a whole word of the path: Q4_K matches "x-Q4_K.gguf", not "x-Q4_K_M.gguf".
    return re.compile(rf"(?:^|[-./]){re.escape(quant.upper())}(?:$|[-./])")


def pick_gguf(files, where: str, quant: str | None = None,
              how: str = "name one with :QUANT or /FILE.gguf") -> str | None:
    """Of the paths `files` (in a repository or a folder, `where` in messages), the GGUF file to
    load: the one of `quant`, or without it the only one (projector files, mmproj*, left aside);
    None where there is no .gguf file at all (and no `quant`). Raises ModelFileError naming what
    there is when none or several fit (`how` says how to pick one)."""
    ggufs = sorted(f for f in files if f.endswith(GGUF_SUFFIX))
    if quant is not None:
        if not ggufs:
            raise ModelFileError(f"{where} has no .gguf file: :{quant} picks one of a GGUF repository")
        fits = [f for f in ggufs if _quant_pattern(quant).search(f[:-len(GGUF_SUFFIX)].upper())]
        if not fits:
            raise ModelFileError(f"{where} has no .gguf file of {quant}; it has {_listed(ggufs)}")
        if len(fits) > 1:
            raise ModelFileError(f"{where} has {len(fits)} .gguf files of {quant} ({_listed(fits)}): name one "
                                 "as org/name/FILE.gguf (a model split over several files is not read)")
        return fits[0]
    models = [f for f in ggufs if not f.rsplit("/", 1)[-1].startswith("mmproj")]
    if len(models) > 1:
        raise ModelFileError(f"{where} has {len(models)} .gguf files: {how} ({_listed(models)})")
    return models[0] if models else None


def _weights(files: set[str], where: str, index_of) -> list[str]:
    """The safetensors files of a model repository: model.safetensors, or the index and its shards
    (`index_of()` reads the index, fetched where needed)."""
    if SINGLE in files:
        return [SINGLE]
    if INDEX not in files:
        kinds = sorted({f.rsplit(".", 1)[-1] for f in files if "/" not in f and "." in f} - {"json", "md", "txt"})
        raise ModelFileError(f"{where} has config.json but no {SINGLE} or {INDEX} (its files: "
                             f"{', '.join(kinds) or 'none'}): arcpy reads safetensors weights")
    doc = index_of()
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelFileError(f"{where}: {INDEX} has no weight_map of file names")
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if s not in files]
    if missing:
        raise ModelFileError(f"{where}: {INDEX} names {quoted(missing[0])}, which it does not hold")
    return [INDEX, *shards]


class _Hub:
    """One resolution's calls into huggingface_hub (imported here: only a name needs it)."""

    def __init__(self, name: HubName, revision: str | None, offline: str | None, cache_dir: str | None):
        import huggingface_hub
        from huggingface_hub import constants

        self.hf, self.name, self.revision = huggingface_hub, name, revision
        self.why_offline = offline or ("HF_HUB_OFFLINE is on" if constants.HF_HUB_OFFLINE else None)
        self.cache_dir = cache_dir or constants.HF_HUB_CACHE
        self.endpoint = constants.ENDPOINT
        self.where = name.repo + (f" (revision {revision})" if revision else "")
        self.note = None
        self.pull = f"arcpy pull {name}" + (f" --revision {revision}" if revision else "")

    @property
    def offline(self) -> bool:
        return self.why_offline is not None

    def files(self) -> set[str]:
        """The repository's files: listed by the hub, or offline (or the hub unreachable) those in the cache."""
        if not self.offline:
            try:
                # model_info: one request, which fails at once without a network (a listing retries for long).
                siblings = self.hf.HfApi().model_info(self.name.repo, revision=self.revision).siblings
                if siblings is not None:
                    return {s.rfilename for s in siblings}
                return set(self.hf.HfApi().list_repo_files(self.name.repo, revision=self.revision))
            except Exception as exc:  # noqa: BLE001 - every failure of the hub is one line, or a fall-back
                if not _unreachable(exc):
                    raise self.error(exc) from None
                self.why_offline = f"the hub at {self.endpoint} cannot be reached ({_first_line(exc)})"
                self.note = f"{self.why_offline}: {self.where} from the cache"
        folder = self.cached_folder()
        return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}

    def cached_folder(self) -> Path:
        """The revision's snapshot folder in the cache, as the hub lays it out: refs/<revision> holds
        the commit of snapshots/<commit>. (The hub's own snapshot_download refuses a folder whose
        other files were never fetched: a GGUF repository pulled for one quantization.)"""
        from huggingface_hub.file_download import repo_folder_name

        top = Path(self.cache_dir) / repo_folder_name(repo_id=self.name.repo, repo_type="model")
        commit = self.revision or "main"
        if not re.fullmatch(r"[0-9a-f]{40}", commit):
            try:
                commit = (top / "refs" / commit).read_text().strip()
            except (OSError, UnicodeDecodeError):
                commit = ""
        folder = top / "snapshots" / commit
        if not commit or not folder.is_dir():
            raise ModelFileError(f"{self.where} is not in the Hugging Face cache ({self.cache_dir}) and "
                                 f"{self.why_offline}: fetch it with the network first ({self.pull})")
        return folder

    def download(self, filename: str) -> str:
        try:
            return self.hf.hf_hub_download(self.name.repo, filename, revision=self.revision,
                                           cache_dir=self.cache_dir, local_files_only=self.offline)
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc, filename) from None

    def snapshot(self, files: list[str]) -> str:
        try:
            return self.hf.snapshot_download(self.name.repo, revision=self.revision, cache_dir=self.cache_dir,
                                             allow_patterns=files, local_files_only=self.offline)
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc) from None

    def error(self, exc: Exception, filename: str | None = None) -> ModelFileError:
        """A failure of the hub, as one line."""
        e = self.hf.errors
        if isinstance(exc, e.GatedRepoError):
            return ModelFileError(f"{self.name.repo} is gated: accept its terms on the hub, then give a token "
                                  "(HF_TOKEN, or `hf auth login`)")
        if isinstance(exc, e.RepositoryNotFoundError):
            return ModelFileError(f"{self.name.repo}: no such model repository on the hub at {self.endpoint} "
                                  "(a private one needs a token: HF_TOKEN)")
        if isinstance(exc, e.RevisionNotFoundError):
            return ModelFileError(f"{self.name.repo}: no revision {quoted(self.revision or 'main')}")
        if isinstance(exc, e.LocalEntryNotFoundError):
            what = f"{self.where}: {filename}" if filename else self.where
            return ModelFileError(f"{what} is not in the Hugging Face cache ({self.cache_dir}) and "
                                  f"{self.why_offline or 'the hub is not asked'}: fetch it with the network first "
                                  f"({self.pull})")
        if isinstance(exc, e.EntryNotFoundError):
            return ModelFileError(f"{self.where} has no file {quoted(filename or '?')}")
        if isinstance(exc, e.HfHubHTTPError):
            return ModelFileError(f"{self.where}: the hub at {self.endpoint} answered: {_first_line(exc)}")
        if isinstance(exc, e.HFValidationError):
            return ModelFileError(f"{quoted(str(self.name))} is not a model name of the hub: {_first_line(exc)}")
        if _unreachable(exc):
            return ModelFileError(f"cannot reach the hub at {self.endpoint} ({_first_line(exc)}) to fetch "
                                  f"{self.where}")
        if isinstance(exc, OSError):
            return ModelFileError(f"{self.where}: cannot write it to the cache {self.cache_dir} "
                                  f"({exc.strerror or _first_line(exc)})")
        return ModelFileError(f"{self.where}: {type(exc).__name__}: {_first_line(exc)}")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _unreachable(exc: Exception) -> bool:
    """A failure to reach the hub at all (no network, no such host, a timeout, offline mode), in
    whichever HTTP library this huggingface_hub uses."""
    from huggingface_hub import errors

    if isinstance(exc, errors.OfflineModeIsEnabled):
        return True
    if isinstance(exc, errors.HfHubHTTPError):
        return False
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"ConnectError", "ConnectionError", "ConnectTimeout", "TimeoutException", "Timeout",
                         "NetworkError", "ProxyError"})


def resolve_name(name: HubName, revision: str | None = None, offline: str | None = None,
                 cache_dir: str | None = None) -> Resolved:
    """The files of a model named on the hub, fetched into the cache where they are not there yet
    (never where `offline` says why not, nor with HF_HUB_OFFLINE on): a .gguf file's path, or the
    snapshot folder of a safetensors model. Raises ModelFileError, one line."""
    if revision is not None and (not revision.strip() or "\0" in revision or ".." in revision):
        raise ModelFileError(f"revision {quoted(revision)} is not a branch, tag or commit")
    hub = _Hub(name, revision, offline, cache_dir)
    files = hub.files()
    where = hub.where + (" in the cache" if hub.offline else "")
    if name.file is not None:
        if name.file not in files:
            raise ModelFileError(f"{where} has no file {quoted(name.file)}; its .gguf files: "
                                 f"{_listed(f for f in files if f.endswith(GGUF_SUFFIX)) or 'none'}")
        return Resolved(hub.download(name.file), str(name), hub.note)
    if name.quant is not None or "config.json" not in files:
        gguf = pick_gguf(files, where, name.quant)
        if gguf is None:
            raise ModelFileError(f"{where} has neither config.json nor a .gguf file: not a model arcpy reads")
        return Resolved(hub.download(gguf), str(name), hub.note)
    weights = _weights(files, where, lambda: read_json_file(Path(hub.download(INDEX)), "safetensors index"))
    folder = hub.snapshot([f for f in TEXT_FILES if f in files] + weights)
    return Resolved(folder, str(name), hub.note)


def resolve_model(text: str, revision: str | None = None, offline: str | None = None,
                  cache_dir: str | None = None) -> Resolved:
    """--model's value on this machine: a path as it is, or a name of the hub resolved
    (resolve_name). Raises ModelFileError, one line, for anything else."""
    if os.path.exists(text):
        if revision is not None:
            raise ModelFileError(f"a revision ({revision}) is for a model of the hub; {text} is a path here")
        return Resolved(text, None)
    name = parse_name(text)
    if name is None:
        raise ModelFileError(no_such_model(text))
    return resolve_name(name, revision, offline, cache_dir)
