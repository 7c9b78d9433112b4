"""A model and its text from the files people have: a Hugging Face model directory or a GGUF file.

The checkpoint readers (arcpy.model) and the text layer (arcpy.text) do not know each other; this
is where a checkpoint's weights and its tokenizer meet. Nothing is on the GPU yet.
"""

from __future__ import annotations

import os

from arcpy.errors import ModelFileError
from arcpy.model import Model, load_model, open_gguf
from arcpy.model.gguf import GGUF_SUFFIX
from arcpy.text import TextSpec, gguf_text_spec, load_text_spec


def load_gguf(path, max_seq: int | None = None, progress=None, quantized: bool = True) -> tuple[Model, TextSpec]:
    """Read a Llama-family GGUF file -> (Model, TextSpec from its metadata). The projections and
    the output of the types the GPU reads quantized stay quantized, the rest is bf16
    (`quantized=False`: all of it; arcpy.model.gguf says which). The vocabulary is built before
    the weights are read: a bad one fails in milliseconds. `progress(done, total)` is called
    after each tensor is read."""
    checkpoint = open_gguf(path, max_seq, quantized)
    text = gguf_text_spec(checkpoint.vocabulary())
    return checkpoint.model(progress), text


def load_checkpoint(path, max_seq: int | None = None, progress=None,
                    quantized: bool = True) -> tuple[Model, TextSpec | None]:
    """A model directory or a .gguf file -> (Model, TextSpec, or None where the directory has no
    tokenizer.json). `quantized` is load_gguf's (a directory's safetensors are bf16)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ModelFileError(f"a model path must be a string or a path, got {type(path).__name__}")
    if os.fspath(path).endswith(GGUF_SUFFIX):
        return load_gguf(path, max_seq, progress, quantized)
    return load_model(path, max_seq), load_text_spec(path)
