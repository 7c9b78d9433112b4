"""llama.cpp's tokenizer test cases: each models/ggml-vocab-*.gguf vocabulary with the texts of its
.inp file and the ids llama.cpp gives them in its .out file (fetched by tests/llamacpp_sdist.py).

Every case of every vocabulary arcpy reads encodes, as a user's text (no BOS, special-token
strings as text, as llama.cpp's test encodes), to llama.cpp's ids; a vocabulary arcpy refuses is
refused in one line naming the file and what it is.

The sdist has no vocabulary of gpt-4o's pre-tokenizer (o200k: gpt-oss, Phi-4-mini): there arcpy
cuts a varied text as the models' own tokenizer.json does (the `tokenizers` library running its
expression), and encodes as that tokenizer with the same vocabulary does.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from agent_helpers import QWEN3
from llamacpp_sdist import llamacpp_models
from test_chat_families import read_spec, write_vocab_gguf
from tokenizers import Regex, Tokenizer, pre_tokenizers

from arcpy.errors import ModelFileError
from arcpy.model.gguf_file import read_gguf
from arcpy.model.gguf_vocab import read_vocabulary
from arcpy.text import encode, gguf_text_spec
from arcpy.text.pretokenize import PRE_TOKENIZERS

# The sdist's vocabularies (its hash is pinned, so the list is too): those arcpy reads, and those
# it refuses with what the refusal names.
READ = ["aquila", "baichuan", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2",
        "gpt-neox", "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]
REFUSED = {"bert-bge": "unsupported tokenizer model 'bert'", "nomic-bert-moe": "unsupported tokenizer model 't5'"}
NO_CASES = ("aquila", "baichuan", "gpt-neox")  # vocabularies the sdist has without .inp/.out files
_SEPARATOR = "\n__ggml_vocab_test__\n"


@pytest.fixture(scope="module")
def models() -> Path:
    return llamacpp_models()


def text_spec(path: Path):
    meta = read_gguf(path).meta
    return gguf_text_spec(read_vocabulary(meta, len(meta.strings("tokenizer.ggml.tokens"))))


def cases(vocab: Path) -> dict[str, list[int]]:
    """The texts of `vocab`'s .inp file and llama.cpp's ids for each (.out), read as llama.cpp's
    test reads them: texts between separators (none after a final one), one line of ids each."""
    raw = vocab.with_name(vocab.name + ".inp").read_bytes().decode("utf-8")
    texts = raw.split(_SEPARATOR)
    if raw.endswith(_SEPARATOR) or not raw:
        texts.pop()
    ids = vocab.with_name(vocab.name + ".out").read_bytes().decode("utf-8").split("\n")
    if ids and ids[-1] == "":
        ids.pop()
    assert len(texts) == len(ids), f"{vocab.name}: {len(texts)} texts but {len(ids)} lines of ids"
    return dict(zip(texts, ([int(t) for t in line.split()] for line in ids)))


def test_the_sdist_holds_the_vocabularies_named_here(models):
    names = {p.name[len("ggml-vocab-"):-len(".gguf")] for p in models.glob("ggml-vocab-*.gguf")}
    assert names == set(READ) | set(REFUSED)
    assert any(models.glob("templates/*.jinja"))


@pytest.mark.parametrize("name", READ)
def test_every_case_encodes_to_llama_cpps_ids(models, name):
    vocab = models / f"ggml-vocab-{name}.gguf"
    spec = text_spec(vocab)
    if name in NO_CASES:  # read without an error is all there is to check
        assert not vocab.with_name(vocab.name + ".inp").exists()
        return
    expected = cases(vocab)
    wrong = []
    for text, want in expected.items():
        got = encode(spec, text, add_bos=False)
        if got != want:
            wrong.append(f"{text[:60]!r}: {got[:24]} instead of {want[:24]}")
    assert expected, f"{vocab.name}.inp holds no cases"
    assert not wrong, f"{len(wrong)} of {len(expected)} cases differ:\n" + "\n".join(wrong)


def test_every_pre_tokenizer_name_cuts_every_case_into_pieces_of_it(models):
    """The names without a vocabulary here: each one's expressions compile, and cut llama.cpp's
    texts into pieces that are the text, in order."""
    texts = {t for n in READ if n not in NO_CASES for t in cases(models / f"ggml-vocab-{n}.gguf")}
    for name, pre in PRE_TOKENIZERS.items():
        pre.pre_tokenizer()
        splits = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(rx), "isolated") for rx in pre.splits])
        for text in texts:
            pieces = [piece for piece, _ in splits.pre_tokenize_str(text)]
            assert "".join(pieces) == text and all(pieces), (name, text)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_vocabulary_arcpy_cannot_read_is_refused_in_one_line(models, name):
    vocab = models / f"ggml-vocab-{name}.gguf"
    with pytest.raises(ModelFileError) as e:
        text_spec(vocab)
    message = str(e.value)
    assert "\n" not in message and str(vocab) in message and REFUSED[name] in message


def test_the_files_are_fetched_once(models, monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran again")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert llamacpp_models() == models


def test_where_pip_cannot_reach_the_index_the_tests_skip_saying_so(tmp_path, monkeypatch):
    monkeypatch.setenv("ARC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "1")  # pip says why only as it retries
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no configured index or links besides
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="the index cannot be reached"):
        llamacpp_models()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


# -- gpt-4o's pre-tokenizer (o200k) -------------------------------------------------------------

# The expression of the Split in gpt-oss's tokenizer.json, before its ByteLevel step.
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K_TEXTS = [
    "Hello World", "HelloWorld", "helloWORLD", "HTTPServer", "iPhone", "McDonald's", "I'M HERE", "they'RE", "We'll've",
    "don't DON'T Don'T", "'s 'S 'd", "ÉCOLE école", "Ünïcode", "ΑθήναΣ", "МоскваПривет", "straße STRASSE",
    "ǅemal ǈ",
    "e\u0301te\u0301", "naïve café", "ʰᵉˡˡᵒ", "1", "12", "123", "1234", "1234567", "3.14159", "x2y3 a1b", "$100,000.00",
    "Ⅻ x²+y³", "...!!?? a//b /path/to", "line\n\nnext", "  spaced   out  ", "\t\ttabs", "end   ", "ok\r\n", "  \n  x",
    "hello\u00a0world", "\u3000全角\u3000", "你好世界", "日本語のテキスト", "한국어 텍스트", "🙂👍🏽", "👨\u200d👩\u200d👧",
    "mixed中文English", "C++ and C#", "foo_bar-baz", "<|start|>assistant",
]
_POOL = ("aZqQ'sStTdDlLmMrReEvV" "ÀéÉßΣσДдǅ" "\u0301\u0308" "0123456789²Ⅻ٣" " \t\n\r\u00a0\u3000" ".,;:!?/\\'\"-_()[]{}$%&*+<=>@#"
         "你好日本語한국" "🙂👍🏽\u200d")


def o200k_texts() -> list[str]:
    rng = random.Random(200)
    return O200K_TEXTS + ["".join(rng.choice(_POOL) for _ in range(rng.randint(1, 40))) for _ in range(2000)]


def test_gpt4o_cuts_text_as_the_models_own_tokenizer_does():
    theirs = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(O200K), "isolated"),
                                      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    for name in ("gpt-4o", "llama4"):
        ours = PRE_TOKENIZERS[name].pre_tokenizer()
        for text in o200k_texts():
            assert ours.pre_tokenize_str(text) == theirs.pre_tokenize_str(text), (name, text)


def test_a_gpt4o_gguf_vocabulary_encodes_as_its_tokenizer_json_does(tmp_path):
    """The Qwen3 fixture's byte-level vocabulary and merges, written as a GGUF file with
    pre-tokenizer gpt-4o, and as a tokenizer.json whose pre-tokenizer is o200k's."""
    theirs = Tokenizer.from_file(str(QWEN3 / "tokenizer.json"))
    theirs.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(O200K), "isolated"),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    model = json.loads(theirs.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    assert [model["vocab"][t] for t in tokens] == list(range(len(tokens)))
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    spec = read_spec(write_vocab_gguf(tmp_path / "o200k.gguf", tokens, [1] * len(tokens), "{{ messages }}",
                                      kind="gpt2", merges=merges, pre="gpt-4o"))
    for text in o200k_texts():
        assert encode(spec, text, add_bos=False) == theirs.encode(text, add_special_tokens=False).ids, text
