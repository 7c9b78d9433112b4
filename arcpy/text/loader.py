"""A Hugging Face model directory's text files -> TextSpec.

    tokenizer.json           the tokenizer; without it there is no TextSpec (None)
    tokenizer_config.json    bos_token, eos_token (strings or AddedToken objects), add_bos_token,
                             chat_template (a string, or a list of named templates: "default")
    chat_template.jinja      the chat template; wins over tokenizer_config.json's
    generation_config.json   eos_token_id (an int or a list), bos_token_id
    config.json              eos_token_id, where generation_config.json has none

Every file is optional but tokenizer.json, and each is read through the project's guarded opener:
links are followed, but only to regular files. Anything wrong is one ModelFileError naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from tokenizers import Tokenizer

from arcpy.checks import is_int, quoted
from arcpy.errors import ModelFileError
from arcpy.files import MAX_JSON_BYTES, open_regular, parse_json, read_json_file, reading
from arcpy.text.turns import turn_end_ids
from arcpy.text.limits import MAX_TEMPLATE_CHARS, check_template_size
from arcpy.text.spec import TextSpec

MAX_TEMPLATE_BYTES = 4 * MAX_TEMPLATE_CHARS  # UTF-8: at most four bytes a character


def load_text_spec(directory) -> TextSpec | None:
    """The TextSpec of a Hugging Face model directory, or None when it has no tokenizer.json."""
    if "\0" in os.fspath(directory):
        raise ModelFileError(f"{quoted(os.fspath(directory))}: not a valid path")
    directory = Path(directory)
    with reading(directory):
        return _load(directory)


def _load(directory: Path) -> TextSpec | None:
    if not directory.is_dir():
        raise ModelFileError(f"{directory}: not a model directory")
    tok_path = directory / "tokenizer.json"
    if not os.path.lexists(tok_path):
        return None
    tokenizer = _read_tokenizer(tok_path)
    tcfg, tsrc = _optional_json(directory / "tokenizer_config.json", "tokenizer config")
    gen, gsrc = _optional_json(directory / "generation_config.json", "generation config")
    mcfg, msrc = _optional_json(directory / "config.json", "config")

    bos_id = _named_token(tokenizer, tcfg, "bos_token", tsrc)
    if bos_id is None:
        bos_id = _single_id(tokenizer, gen, "bos_token_id", gsrc)

    # The tokenizer's own EOS comes first (templates call it eos_token), then what generation
    # stops on; the union, since instruct models end a turn with a token the base model lacks.
    eos = [_named_token(tokenizer, tcfg, "eos_token", tsrc)]
    eos += _ids(tokenizer, gen, "eos_token_id", gsrc) or _ids(tokenizer, mcfg, "eos_token_id", msrc)
    eos += turn_end_ids(tokenizer)  # a family's turn ends a file may leave out (arcpy.text.turns)
    eos_ids = tuple(dict.fromkeys(i for i in eos if i is not None))

    add_bos = tcfg.get("add_bos_token")
    if add_bos is None:  # no word from the config: BOS is added when the post-processor adds it
        lead = tokenizer.encode("", add_special_tokens=True).ids
        add_bos = bool(lead) and lead[0] == bos_id
    elif not isinstance(add_bos, bool):
        raise ModelFileError(f"{tsrc}: key 'add_bos_token' must be true or false, got {quoted(add_bos)}")

    template_path = directory / "chat_template.jinja"
    if os.path.lexists(template_path):
        template = check_template_size(_read_text(template_path, "chat template", MAX_TEMPLATE_BYTES),
                                       str(template_path))
    else:
        template = _config_template(tcfg, tsrc)
        if template is not None:
            check_template_size(template, f"{tsrc}: key 'chat_template'")
    return TextSpec(tokenizer, bos_id, eos_ids, add_bos and bos_id is not None, template)


def _read_bytes(path: Path, what: str, limit: int) -> bytes:
    fh, size = open_regular(path)
    with fh:
        if size > limit:
            raise ModelFileError(f"{path}: {size} bytes is too large for a {what}")
        return fh.read(limit + 1)


def _read_text(path: Path, what: str, limit: int) -> str:
    try:
        return _read_bytes(path, what, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise ModelFileError(f"{path}: {what} is not UTF-8 text") from None


def _read_tokenizer(path: Path) -> Tokenizer:
    text = _read_text(path, "tokenizer", MAX_JSON_BYTES)
    try:
        return Tokenizer.from_str(text)
    except Exception as e:
        err = e
    except BaseException as e:  # a Rust panic surfaces as pyo3's PanicException, a BaseException
        if type(e).__name__ != "PanicException":
            raise
        err = e
    _, problem = parse_json(text.encode("utf-8"))
    if problem is not None:
        raise ModelFileError(f"{path}: tokenizer {problem}")
    raise ModelFileError(f"{path}: not a tokenizer the tokenizers library reads ({quoted(str(err), 160)})")


def _optional_json(path: Path, what: str) -> tuple[dict, str]:
    """(the file's JSON object, its name for messages); an absent file reads as {}."""
    if not os.path.lexists(path):
        return {}, str(path)
    value = read_json_file(path, what)
    if not isinstance(value, dict):
        raise ModelFileError(f"{path}: {what} must be a JSON object, got {quoted(value)}")
    return value, str(path)


def _checked_id(tokenizer: Tokenizer, v, key: str, src: str) -> int:
    if not is_int(v):
        raise ModelFileError(f"{src}: key '{key}' must be a token id, got {quoted(v)}")
    if not 0 <= v < 2**32 or tokenizer.id_to_token(v) is None:
        raise ModelFileError(f"{src}: key '{key}': {quoted(v)} is not a token id of tokenizer.json")
    return int(v)


def _single_id(tokenizer: Tokenizer, d: dict, key: str, src: str) -> int | None:
    v = d.get(key)
    return None if v is None else _checked_id(tokenizer, v, key, src)


def _ids(tokenizer: Tokenizer, d: dict, key: str, src: str) -> list[int]:
    """An id or a list of ids (Llama 3 stops on several); absent or null is none."""
    v = d.get(key)
    if v is None:
        return []
    if isinstance(v, list):
        return [_checked_id(tokenizer, i, key, src) for i in v]
    return [_checked_id(tokenizer, v, key, src)]


def _named_token(tokenizer: Tokenizer, d: dict, key: str, src: str) -> int | None:
    """The id of a special token the config names by its text: "<s>" or {"content": "<s>", ...}."""
    v = d.get(key)
    if v is None:
        return None
    text = v.get("content") if isinstance(v, dict) else v
    if not isinstance(text, str):
        raise ModelFileError(f"{src}: key '{key}' must be a string or an object with a string "
                             f"'content', got {quoted(v)}")
    token_id = tokenizer.token_to_id(text)
    if token_id is None:
        raise ModelFileError(f"{src}: key '{key}': {quoted(text)} is not a token of tokenizer.json")
    return token_id


def _config_template(d: dict, src: str) -> str | None:
    """tokenizer_config.json's chat_template: a string, or the list entry named "default" (a list
    without one leaves the model without a usable template, as in transformers)."""
    v = d.get("chat_template")
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list):
        chosen = None
        for entry in v:
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("template"), str)):
                raise ModelFileError(f"{src}: key 'chat_template': each entry of the list must be an "
                                     f"object with string 'name' and 'template', got {quoted(entry)}")
            if entry["name"] == "default":
                chosen = entry["template"]
        return chosen
    raise ModelFileError(f"{src}: key 'chat_template' must be a string or a list of named templates, "
                         f"got {quoted(v)}")
