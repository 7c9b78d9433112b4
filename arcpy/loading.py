"""A model and its text from the files people have: a Hugging Face model directory or a GGUF file.

The checkpoint readers (arcpy.model) and the text layer (arcpy.text) do not know each other; this
is where a checkpoint's weights and its tokenizer meet. Nothing is on the GPU yet.
"""

from __future__ import annotations

import os

from arcpy.errors import InvalidArgumentError, ModelFileError
from arcpy.model import Model, load_model, open_gguf
from arcpy.model.gguf import GGUF_SUFFIX
from arcpy.model.hub import pick_gguf
from arcpy.model.quant_pack import GGUF_FORMATS
from arcpy.text import TextSpec, gguf_text_spec, load_text_spec

# Below this many bytes of bf16 weights read a token, a model decodes faster in bf16 than in the
# file's quantized formats: a quantized GEMV's fixed cost per launch (5 to 10 us on the H200,
# against 3 to 4 for the bf16 one: docs/PERF.md) outweighs the bytes it saves. Measured on the
# H200, 2026-12-01, device loop at burst 16, us a token: the SmolLM2-135M dims (0.27 GB a token in
# bf16) 427 in bf16, 552 as Q4_1, 513 as Q8_0; stories110M (0.22 GB) 204 and 247 as Q4_1; the
# Llama-3.2-1B dims (2.47 GB) 822 and 513 as Q4_1.
AUTO_QUANTIZED_MIN_BYTES = 1 << 30


def load_gguf(path, max_seq: int | None = None, progress=None,
              quantized: bool | None = None) -> tuple[Model, TextSpec]:
    """Read a Llama-family GGUF file -> (Model, TextSpec from its metadata). With `quantized`
    True the projections and the output of the types the GPU reads quantized stay quantized, the
    rest is bf16 (arcpy.model.gguf says which); False: all of it bf16; None (auto): quantized
    where the model reads at least AUTO_QUANTIZED_MIN_BYTES a token in bf16, else bf16, said in
    the model's notes. The vocabulary is built before the weights are read: a bad one fails in
    milliseconds. `progress(done, total)` is called after each tensor is read."""
    if quantized not in (None, True, False):
        raise InvalidArgumentError(f"quantized must be True, False or None (auto), got {quantized!r}")
    checkpoint = open_gguf(path, max_seq, quantized is not False)
    note = None
    if quantized is None and checkpoint.config.weight_bytes < AUTO_QUANTIZED_MIN_BYTES and any(
            info.qtype in GGUF_FORMATS for info in checkpoint.file.tensors.values()):
        checkpoint = open_gguf(path, max_seq, False)
        note = (f"weights held in bf16: at {checkpoint.config.weight_bytes / 1e9:.2f} GB a token, this model "
                "decodes faster in bf16 than in the file's quantized formats (--weights quantized keeps them)")
    text = gguf_text_spec(checkpoint.vocabulary())
    model = checkpoint.model(progress)
    if note is not None:
        model = Model(model.config, model.tensors, model.name, model.source, notes=(*model.notes, note))
    return model, text


def load_checkpoint(path, max_seq: int | None = None, progress=None,
                    quantized: bool | None = None) -> tuple[Model, TextSpec | None]:
    """A model directory, a .gguf file, or a folder holding one .gguf file and no config.json ->
    (Model, TextSpec, or None where the directory has no tokenizer.json). `quantized` is
    load_gguf's (a directory's safetensors are bf16)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ModelFileError(f"a model path must be a string or a path, got {type(path).__name__}")
    if os.fspath(path).endswith(GGUF_SUFFIX):
        return load_gguf(path, max_seq, progress, quantized)
    gguf = gguf_in_folder(path)
    if gguf is not None:
        return load_gguf(gguf, max_seq, progress, quantized)
    return load_model(path, max_seq), load_text_spec(path)


def gguf_in_folder(path) -> str | None:
    """The .gguf file a folder without config.json holds (mmproj* projector files aside); None where
    `path` is no such folder. Several .gguf files are an error listing them."""
    try:
        if not os.path.isdir(path) or os.path.lexists(os.path.join(path, "config.json")):
            return None
        names = os.listdir(path)
    except (OSError, ValueError):  # unreadable, or a NUL in the path: load_model says so
        return None
    name = pick_gguf(names, os.fspath(path), how="name the file")
    return None if name is None else os.path.join(path, name)
