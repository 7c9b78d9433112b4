"""Request: what a front end asks the engine for. The CLI, the server and the chat builds one; the
engine's `stream`, `generate` and `chat` take it.

One of three prompts: `prompt_ids` (token ids, fed as they are), `prompt` (text, encoded with
special-token strings as ordinary text) or `messages` (a conversation, rendered through the
model's chat template: only the template's own markup becomes special tokens). Then the budget of
new tokens, what stops the answer (token ids, on the device; strings, on the host, never shown),
and the sampling (temperature, top-k, top-p and the seed; arcpy.sampling).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arcpy.checks import is_int, quoted
from arcpy.errors import InvalidArgumentError
from arcpy.sampling import Sampling

ROLES = ("system", "user", "assistant", "tool")  # the roles chat templates know
DEFAULT_MAX_NEW_TOKENS = 256


@dataclass(frozen=True)
class Message:
    role: str     # one of ROLES
    content: str

    def __post_init__(self):
        if self.role not in ROLES:
            raise InvalidArgumentError(f"unknown message role {quoted(self.role)} (known: {', '.join(ROLES)})")
        if not isinstance(self.content, str):
            raise InvalidArgumentError(f"a message's content must be a string, got {quoted(self.content)}")
        check_unicode(self.content, f"the {self.role} message")

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Request:
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    messages: tuple[Message, ...] | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    stop_ids: tuple[int, ...] = ()   # besides the model's end-of-sequence ids, which always stop
    stop: tuple[str, ...] = ()       # stop strings: the answer ends before the first one
    sampling: Sampling = field(default_factory=Sampling)

    def __post_init__(self):
        given = [name for name in ("prompt", "prompt_ids", "messages") if getattr(self, name) is not None]
        if len(given) != 1:
            raise InvalidArgumentError("a request takes exactly one of prompt, prompt_ids and messages, "
                                       f"got {', '.join(given) or 'none'}")
        if self.prompt is not None:
            if not isinstance(self.prompt, str):
                raise InvalidArgumentError(f"prompt must be a string, got {type(self.prompt).__name__}")
            check_unicode(self.prompt, "the prompt")
        if self.prompt_ids is not None:
            object.__setattr__(self, "prompt_ids", _ids(self.prompt_ids, "prompt_ids"))
            if not self.prompt_ids:
                raise InvalidArgumentError("prompt_ids is empty: give at least one token id")
        if self.messages is not None:
            object.__setattr__(self, "messages", _messages(self.messages))
        if not (is_int(self.max_new_tokens) and self.max_new_tokens >= 0):
            raise InvalidArgumentError(f"max_new_tokens must be an integer >= 0, got {quoted(self.max_new_tokens)}")
        object.__setattr__(self, "stop_ids", _ids(self.stop_ids, "stop_ids"))
        object.__setattr__(self, "stop", _stops(self.stop))
        if not isinstance(self.sampling, Sampling):
            raise InvalidArgumentError(f"sampling must be an arcpy.sampling.Sampling, got "
                                       f"{type(self.sampling).__name__}")

    @property
    def is_text(self) -> bool:
        """Whether the prompt needs the model's tokenizer."""
        return self.prompt_ids is None


def check_unicode(text: str, what: str) -> None:
    """Refuse a string with a lone surrogate: what bytes that are not UTF-8 become in a command
    line argument, and what no tokenizer takes. The error points into `text` itself."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"{what} is not valid UTF-8: character {e.start} is a byte that is not UTF-8, "
                                   f"after {quoted(text[max(0, e.start - 20):e.start])}") from None


def _ids(value, what: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InvalidArgumentError(f"{what} must be a list of token ids, got {type(value).__name__}")
    ids = tuple(value)
    for t in ids:
        if not (is_int(t) and t >= 0):
            raise InvalidArgumentError(f"{what}: a token id must be an integer >= 0, got {quoted(t)}")
    return tuple(int(t) for t in ids)


def _messages(value) -> tuple[Message, ...]:
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise InvalidArgumentError("messages must be a list of {'role': ..., 'content': ...}")
    out = []
    for i, m in enumerate(value):
        if isinstance(m, dict):
            extra = sorted(set(m) - {"role", "content"})
            if extra:
                raise InvalidArgumentError(f"messages[{i}]: unsupported key {quoted(extra[0])} "
                                           "(a message has 'role' and 'content')")
            m = Message(m.get("role"), m.get("content"))
        elif not isinstance(m, Message):
            raise InvalidArgumentError(f"messages[{i}] must be a dict with 'role' and 'content', "
                                       f"got {type(m).__name__}")
        out.append(m)
    if not out:
        raise InvalidArgumentError("messages is empty: give at least one message")
    return tuple(out)


def _stops(value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not hasattr(value, "__iter__"):
        raise InvalidArgumentError(f"stop must be a string or a list of strings, got {type(value).__name__}")
    stops = tuple(value)
    for s in stops:
        if not isinstance(s, str) or not s:
            raise InvalidArgumentError(f"a stop string must be a non-empty string, got {quoted(s)}")
    return stops
