"""Gemma 4's answers: reasoning in a thought channel, calls in its own markup.

    <|channel>thought\\n...<channel|>                         reasoning
    <|tool_call>call:NAME{key:value,...}<tool_call|>          a call (one or more in a row)
    <|tool_response>                                          the model waits for the results

A call's arguments are written as the chat template writes them back: keys bare, strings between
<|"|> marks (no escapes inside), numbers, true and false as in JSON, lists in brackets, objects in
braces. The tools' results come back as <|tool_response>response:NAME{...}<tool_response|>, which
the template writes. A turn ends with <turn|>, and after its calls with <|tool_response>: both end
the answer (arcpy.text.turns).
"""

from __future__ import annotations

import json
import re

THOUGHT_OPEN, THOUGHT_CLOSE = "<|channel>thought\n", "<channel|>"
CALL_OPEN, CALL_CLOSE, RESPONSE, QUOTE = "<|tool_call>", "<tool_call|>", "<|tool_response>", '<|"|>'
TURN_END = "<turn|>"
TAGS = ("<|channel>", THOUGHT_CLOSE, CALL_OPEN, CALL_CLOSE, RESPONSE, QUOTE)
_NAME = re.compile(r"call:([A-Za-z0-9_.\-]{1,64})\s*(?=\{)")
_BARE = re.compile(r"[^,:{}\[\]]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")
_WORDS = {"true": True, "false": False, "null": None, "None": None}


def is_gemma4(chat_template: str | None) -> bool:
    """Whether a chat template writes Gemma 4's calls."""
    return CALL_OPEN in (chat_template or "")


def parse_call(body: str) -> tuple[str, str] | None:
    """One call's (name, arguments as JSON text) from the body between its tags
    (`call:NAME{...}`), or None where it is not one."""
    m = _NAME.match(body.strip())
    if m is None:
        return None
    reader = _Reader(body.strip(), m.end())
    try:
        value = reader.value()
    except ValueError:
        return None
    if not isinstance(value, dict) or reader.rest().strip():
        return None
    return m.group(1), json.dumps(value, ensure_ascii=False)


class _Reader:
    """Gemma 4's argument syntax, read from `text` at `at`: ValueError where it is not that."""

    def __init__(self, text: str, at: int):
        self.text, self.at = text, at

    def rest(self) -> str:
        return self.text[self.at:]

    def _skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def _take(self, token: str) -> bool:
        self._skip()
        if self.text.startswith(token, self.at):
            self.at += len(token)
            return True
        return False

    def value(self):
        self._skip()
        if self._take("{"):
            return self._object()
        if self._take("["):
            return self._list()
        if self._take(QUOTE):
            return self._quoted()
        if self.text.startswith('"', self.at):
            value, end = json.JSONDecoder().raw_decode(self.text, self.at)
            self.at = end
            return value
        word = _BARE.match(self.text, self.at).group().strip()
        if not word:
            raise ValueError("a value is missing")
        self.at = _BARE.match(self.text, self.at).end()
        if word in _WORDS:
            return _WORDS[word]
        if _NUMBER.match(word):
            return json.loads(word)
        return word  # a bare word the model left unquoted: its text

    def _quoted(self) -> str:
        end = self.text.find(QUOTE, self.at)
        if end < 0:
            raise ValueError("a string is not closed")
        out, self.at = self.text[self.at:end], end + len(QUOTE)
        return out

    def _key(self) -> str:
        self._skip()
        if self._take(QUOTE):
            return self._quoted()
        if self.text.startswith('"', self.at):
            key, self.at = json.JSONDecoder().raw_decode(self.text, self.at)
            if isinstance(key, str):
                return key
            raise ValueError("a key is not a string")
        word = _BARE.match(self.text, self.at)
        if not word.group().strip():
            raise ValueError("a key is missing")
        self.at = word.end()
        return word.group().strip()

    def _object(self) -> dict:
        out = {}
        if self._take("}"):
            return out
        while True:
            key = self._key()
            if not self._take(":"):
                raise ValueError("a key has no value")
            out[key] = self.value()
            if self._take("}"):
                return out
            if not self._take(","):
                raise ValueError("an object is not closed")

    def _list(self) -> list:
        out = []
        if self._take("]"):
            return out
        while True:
            out.append(self.value())
            if self._take("]"):
                return out
            if not self._take(","):
                raise ValueError("a list is not closed")
