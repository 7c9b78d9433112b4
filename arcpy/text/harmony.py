"""gpt-oss's harmony format: an answer is messages, each a header and a body.

    <|start|>assistant<|channel|>analysis<|message|>...<|end|>                        reasoning
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
                                                                                         a tool call
    <|start|>assistant<|channel|>final<|message|>...<|return|>                          the answer

The header is what comes before <|message|>: the role, <|channel|> and the channel's name, the
recipient (`to=functions.NAME`, before or after the channel) and the body's content type
(`<|constrain|>json`, or `json` alone). The prompt ends with `<|start|>assistant`, so the answer's
first header has neither. <|end|> ends a message and the answer goes on; <|call|> (a call's
message) and <|return|> (the final one) end the answer: they are the model's stop tokens. A
tool's result comes back as `<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>
...<|end|>`, which the chat template writes.

The tags are special tokens (the decoder skips them): the answer splitter (arcpy.text.answer)
gets them by id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
CALL, RETURN, CONSTRAIN = "<|call|>", "<|return|>", "<|constrain|>"
TAGS = (START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN)
TURN_ENDS = (RETURN, CALL)                  # what ends the answer
BODY_ENDS = (END, CALL, RETURN, START)      # what ends a message's body (a <|start|> with no <|end|> before it too)
HEAD_OPENERS = (CHANNEL, START, " to=", CONSTRAIN)  # what a header starts with
MAX_HEADER = 256                            # characters a header has, at most: past that it was never one
FUNCTIONS = "functions."
REASONING = "analysis"

_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")
_RECIPIENT = re.compile(r"(?:^|\s|>)to=([^\s<]+)")


@dataclass(frozen=True)
class Header:
    """A message's header: its channel ("" where it names none) and its recipient (None: the
    message is to the user)."""

    channel: str
    recipient: str | None

    @property
    def function(self) -> str | None:
        """The function a call's message is to (its recipient, less the "functions." namespace)."""
        if self.recipient is None:
            return None
        return self.recipient[len(FUNCTIONS):] if self.recipient.startswith(FUNCTIONS) else self.recipient


def read_header(text: str) -> Header:
    """The header of a message, `text` being all before its <|message|>."""
    channel = _CHANNEL.search(text)
    recipient = _RECIPIENT.search(text)
    return Header(channel.group(1) if channel else "", recipient.group(1) if recipient else None)


def is_harmony(chat_template: str | None) -> bool:
    """Whether a chat template writes harmony's messages."""
    return CHANNEL in (chat_template or "")
