"""What the agent tests share: a text of a family's kind (the Qwen3 fixture's byte-level tokenizer,
which encodes any text, under a real chat template where one is given; with harmony's tags as
special tokens for gpt-oss's), and the Typist: a
stand-in device whose forward puts the highest logit on the next token of an answer its script
writes for the prompt, so that a test can make a model call a tool, or answer, on cue. Where a
grammar forbids the scripted token, the mask decides as it would for a real model."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np
from serve_helpers import InProcess
from tokenizers import AddedToken

from arcpy.devices.numpy_device import HostPathDevice
from arcpy.devices.protocol import Capabilities
from arcpy.loop import gate
from arcpy.loop.engine import Engine
from arcpy.serve.app import Service, Settings, create_app
from arcpy.serve.schema import Defaults
from arcpy.serve.worker import Worker
from arcpy.text import TextSpec, encode, load_text_spec
from arcpy.text.harmony import TAGS
from arcpy.text.turns import turn_end_ids

QWEN3 = Path(__file__).parent / "data" / "families" / "qwen3"


def family_text(template: str | None = None) -> TextSpec:
    spec = load_text_spec(QWEN3)
    return spec if template is None else dataclasses.replace(spec, chat_template=template)


def harmony_text(template: str) -> TextSpec:
    """The family text with harmony's tags (<|start|>, <|channel|>, ...) as special tokens, under
    `template`; its end-of-sequence ids are the tokenizer's own, then <|return|> and <|call|>."""
    spec = family_text(template)
    tokenizer = type(spec.tokenizer).from_str(spec.tokenizer.to_str())
    tokenizer.add_special_tokens([AddedToken(tag, special=True, normalized=False) for tag in TAGS])
    return dataclasses.replace(spec, tokenizer=tokenizer, eos_ids=spec.eos_ids + turn_end_ids(tokenizer))


class Typist(HostPathDevice):
    """DeviceOps of the host path: `script(prompt_text)` is the answer to type (then the first
    end-of-sequence id); the special-token strings it holds are those tokens where
    `parse_special`."""

    parse_special = False
    capabilities = Capabilities("typist (a scripted host path)", prefill=True)

    def __init__(self, text: TextSpec, script: Callable[[str], str], max_seq: int = 4096):
        super().__init__(text.tokenizer.get_vocab_size(), max_seq)
        self.text, self.script = text, script
        self.answer: list[int] = []
        self.start = 0
        self.prompts: list[str] = []   # every prompt it was given, as text

    def _logits_at(self, position: int) -> np.ndarray:
        logits = np.zeros(self.vocab, np.float32)
        k = position + 1 - self.start
        logits[self.answer[k] if k < len(self.answer) else self.text.eos_ids[0]] = 60.0  # the others e^-60 as likely
        return logits

    def enqueue_prefill(self, tokens, start: int) -> None:
        tokens = list(tokens)
        prompt = self.text.tokenizer.decode(tokens, skip_special_tokens=False)
        self.prompts.append(prompt)
        self.answer = encode(self.text, self.script(prompt), add_bos=False,
                             parse_special=self.parse_special) + [self.text.eos_ids[0]]
        self.start = start + len(tokens)
        self.logits = self._logits_at(start + len(tokens) - 1)

    def enqueue_forward(self, eager: bool = False) -> None:
        self.logits = self._logits_at(self.position)


def typist_engine(text: TextSpec, script: Callable[[str], str], device=Typist) -> Engine:
    engine = Engine(device(text, script), "typist", environ={}, latch=gate.FallbackLatch())
    engine.text = text
    return engine


def typist_server(text: TextSpec, script: Callable[[str], str], name: str = "typist", settings: dict | None = None,
                  device=Typist, **defaults) -> InProcess:
    """The app on uvicorn in this process, over a Typist engine (`device`: the Typist or a class of
    its kind); `.engine` is the engine. `settings`: the Settings besides the name, the context and
    the defaults (api_key, ...)."""
    holder = {}

    def build():
        holder["engine"] = typist_engine(text, script, device)
        return holder["engine"]

    worker = Worker(build, 4, warm_up=False).start()
    configured = Settings(name, 4096, defaults=Defaults(**defaults), **(settings or {}))
    server = InProcess(create_app(Service(worker, text, configured)))
    server.engine = holder["engine"]
    return server
