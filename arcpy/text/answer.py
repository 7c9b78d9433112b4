"""An answer's text split as it streams: reasoning, content and tool calls.

Reasoning is what a model writes between <think> and </think> (Qwen3, SmolLM3; Gemma 4's tags
are <|channel>thought and <channel|>): an answer that opens with <think> (after blank space)
reasons until </think>. Where the prompt itself ends with <think> (the DeepSeek-R1 distills'
templates open it), the answer starts inside the reasoning and holds only the closing tag. Text
after </think> is content, its leading blank lines dropped; an answer that never closes the tag
is all reasoning.

Tool calls are read in the format the template names (arcpy.text.tools). A Hermes, XML or Gemma
4 call is handed out whole as soon as its closing tag lands (an XML call's values typed by the
tools' schemas: `params`); a Mistral or JSON answer's calls once
the answer ends (a JSON answer is calls only if all of it parses as calls; else it is content, as
written).

A harmony answer (gpt-oss, arcpy.text.harmony) is messages: the analysis channel's are reasoning,
a message to a function is a call (handed out whole when its body ends; its arguments the body,
as JSON text), every other message is content. An answer that does not open with a header (one a
grammar wrote) is content, as written.

The splitter holds back only what may still be the start of a tag, so text streams on; and
whatever the pieces, they add up to what the whole text gives (`split`). Tags that are special
tokens (skipped by the decoder: Mistral's [TOOL_CALLS], harmony's) come in by id: `marks`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from arcpy.text import gemma4, harmony, xml_calls
from arcpy.text.spec import TextSpec
from arcpy.text.tools import GEMMA4, HARMONY, HERMES, JSON, MISTRAL, XML, call_id, parse_calls, tool_format

OPEN, CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE, CALLS, PYTHON_TAG = "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>"
MARKS = (OPEN, CLOSE, CALL_OPEN, CALL_CLOSE, CALLS, "[ARGS]", PYTHON_TAG)
_WAIT, _REASON, _CONTENT, _CALL, _TAIL = "wait", "reasoning", "content", "call", "tail"
_HEAD, _BODY, _PLAIN = "head", "body", "plain"  # harmony's: a header, a message's body, text without headers


@dataclass
class Delta:
    """What one push added: reasoning text, content text, or one whole tool call in OpenAI's
    shape ({"index", "id", "type", "function": {"name", "arguments"}})."""

    reasoning: str = ""
    content: str = ""
    tool_call: dict | None = None


@dataclass
class Answer:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)


def special_marks(spec: TextSpec | None) -> dict[int, str]:
    """The ids of tags that are special tokens (the decoder skips them) -> their text."""
    if spec is None:
        return {}
    marks = (MARKS + (harmony.TAGS if harmony.is_harmony(spec.chat_template) else ())
             + (gemma4.TAGS if gemma4.is_gemma4(spec.chat_template) else ()))
    added = spec.tokenizer.get_added_tokens_decoder()
    return {i: t.content for i, t in added.items() if t.special and t.content in marks}


def thinks(spec: TextSpec | None) -> bool:
    """Whether the model's template knows reasoning: tags, or harmony's analysis channel."""
    return spec is not None and (reasoning_tags(spec)[1] in (spec.chat_template or "")
                                 or harmony.is_harmony(spec.chat_template))


def reasoning_tags(spec: TextSpec | None) -> tuple[str, str]:
    """The tags that open and close the model's reasoning."""
    t = spec.chat_template if spec is not None else None
    return (gemma4.THOUGHT_OPEN, gemma4.THOUGHT_CLOSE) if gemma4.THOUGHT_CLOSE in (t or "") else (OPEN, CLOSE)


def opens_thinking(prompt_text: str, tags: tuple[str, str] = (OPEN, CLOSE)) -> bool:
    """Whether a rendered prompt leaves the answer inside the reasoning (the template opened it)."""
    return prompt_text.rstrip().endswith(tags[0].rstrip())


def split_options(spec: TextSpec, ids: list[int], tools, reasoning: bool = True,
                  constrained: bool = False) -> dict | None:
    """The Splitter's options for the answer to the prompt `ids`, None where it is plain text:
    its reasoning read where the template knows some and `reasoning`, its calls where `tools`
    (the request's OpenAI tools, whose schemas type XML's values; any true value where there are
    tools whose schemas do not matter). A `constrained` answer follows its grammar from the
    first token: no reasoning is left open."""
    think = reasoning and thinks(spec)
    fmt = tool_format(spec.chat_template) if tools else None
    if not think and fmt is None:
        return None
    tags = reasoning_tags(spec)
    tail = spec.tokenizer.decode(ids[-8:], skip_special_tokens=False)
    return {"reasoning": think, "opened": think and not constrained and opens_thinking(tail, tags), "tools": fmt,
            "marks": special_marks(spec), "harmony": harmony.is_harmony(spec.chat_template), "tags": tags,
            "params": xml_calls.parameters(tools) if fmt == XML and isinstance(tools, (list, tuple)) else None}


class Splitter:
    """`push(text, token)` -> [Delta]; `finish()` -> the last ones; `answer` the whole so far.

    `reasoning`: read the reasoning `tags` (harmony: the analysis channel); `opened`: the prompt
    ended inside them; `tools`: the call format to read (None: none); `harmony`: the answer is
    harmony's messages (its calls are read where `tools` is HARMONY); `ids` makes call ids;
    `params` types XML's values (xml_calls.parameters: each function's parameters' schemas)."""

    def __init__(self, *, reasoning: bool = False, opened: bool = False, tools: str | None = None,
                 marks: dict[int, str] | None = None, ids: Callable[[str], str] = call_id, harmony: bool = False,
                 tags: tuple[str, str] = (OPEN, CLOSE), params: dict[str, dict] | None = None):
        self.fmt, self.marks, self.ids, self.params = tools, marks or {}, ids, params
        self.open, self.close = tags
        self.call_tags = (gemma4.CALL_OPEN, gemma4.CALL_CLOSE) if tools == GEMMA4 else (CALL_OPEN, CALL_CLOSE)
        self.reasoning = reasoning
        self.header = None  # the harmony message being read: its Header
        self.state = _HEAD if harmony else _REASON if opened else _WAIT if reasoning else _CONTENT
        self.buf = ""
        self.strip = False       # drop the content's leading blank space (after </think>, between calls)
        self.started = False     # content other than blank space was seen (a JSON answer must lead with "{")
        self.answer = Answer()

    def push(self, text: str, token: int | None = None) -> list[Delta]:
        self.buf += text + self.marks.get(token, "")
        return self._run(final=False)

    def finish(self) -> list[Delta]:
        return self._run(final=True)

    # -- the machine -------------------------------------------------------------------------

    def _run(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while True:
            before = (self.state, len(self.buf))
            getattr(self, "_" + self.state)(out, final)
            if (self.state, len(self.buf)) == before:
                return out

    def _wait(self, out, final) -> None:
        head = self.buf.lstrip()
        if head.startswith(self.open):
            self.buf, self.state = head[len(self.open):], _REASON
        elif final or not head or not self.open.startswith(head):
            if head or final:
                self.state = _CONTENT
        # else: it may still become <think>: wait

    def _reasoning(self, out, final) -> None:
        at = self.buf.find(self.close)
        if at >= 0:
            self._emit(out, reasoning=self.buf[:at])
            self.buf, self.state, self.strip = self.buf[at + len(self.close):], _CONTENT, True
            return
        keep = 0 if final else _partial(self.buf, (self.close,))
        self._emit(out, reasoning=self.buf[:len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]

    def _content(self, out, final) -> None:
        if self.strip or (self.fmt == JSON and not self.started):
            head = self.buf.lstrip()
            if not head and not final:
                return
            if self.strip:
                self.buf, self.strip = head, False
            if self.fmt == JSON and not self.started and head:
                if not final and PYTHON_TAG.startswith(head):
                    return  # it may still become <|python_tag|>
                self.started = True
                if head.startswith(("{", "[", PYTHON_TAG)):
                    self.state = _TAIL
                    return
        opener = {HERMES: CALL_OPEN, XML: CALL_OPEN, GEMMA4: gemma4.CALL_OPEN, MISTRAL: CALLS}.get(self.fmt)
        if opener is not None and (at := self.buf.find(opener)) >= 0:
            self._emit(out, content=self.buf[:at])
            self.buf = self.buf[at:] if self.fmt == MISTRAL else self.buf[at + len(opener):]
            self.state = _TAIL if self.fmt == MISTRAL else _CALL
            return
        keep = 0 if final or opener is None else _partial(self.buf, (opener,))
        self._emit(out, content=self.buf[:len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]
        if self.buf:
            self.started = True

    def _call(self, out, final) -> None:
        opener, closer = self.call_tags
        at = self.buf.find(closer)
        if at < 0 and not final:
            return
        body = self.buf if at < 0 else self.buf[:at]
        if self.fmt in (GEMMA4, XML):
            call = gemma4.parse_call(body) if self.fmt == GEMMA4 else xml_calls.parse_call(body, self.params)
            calls = None if call is None else [call]
        else:
            calls = parse_calls(HERMES, body)
        if calls is None:  # not a call after all: the text as written
            self._emit(out, content=opener + self.buf[:len(self.buf) if at < 0 else at + len(closer)])
        else:
            self._calls(out, calls)
        self.buf = "" if at < 0 else self.buf[at + len(closer):]
        self.state, self.strip = _CONTENT, True

    def _tail(self, out, final) -> None:
        if not final:
            return
        text = self.buf
        body = text.replace(PYTHON_TAG, "")
        if self.fmt == MISTRAL:
            body = body.strip()[len(CALLS):]
        calls = parse_calls(self.fmt, body)
        if calls is None:
            self._emit(out, content=text)
        else:
            self._calls(out, calls)
        self.buf, self.state = "", _CONTENT

    # -- harmony's messages --------------------------------------------------------------------

    def _head(self, out, final) -> None:
        at = self.buf.find(harmony.MESSAGE, 0, harmony.MAX_HEADER + len(harmony.MESSAGE))
        if at >= 0:
            self.header = harmony.read_header(self.buf[:at])
            self.buf, self.state = self.buf[at + len(harmony.MESSAGE):], _BODY
            return
        head = self.buf
        if not head or final and head.startswith(harmony.HEAD_OPENERS) and len(head) <= harmony.MAX_HEADER:
            self.buf = ""  # a header cut off by the end of the answer: no message
            return
        if len(head) <= harmony.MAX_HEADER and not final and (
                head.startswith(harmony.HEAD_OPENERS) or any(o.startswith(head) for o in harmony.HEAD_OPENERS)):
            return  # a header, or what may still become one: wait for its <|message|>
        self.state = _PLAIN

    def _body(self, out, final) -> None:
        ends = [(at, tag) for tag in harmony.BODY_ENDS if (at := self.buf.find(tag)) >= 0]
        at, tag = min(ends) if ends else (-1, "")
        call = self.header.recipient is not None and self.fmt == HARMONY
        if call:
            if at < 0 and not final:
                return
            body = self.buf if at < 0 else self.buf[:at]
            self._calls(out, [(self.header.function, _arguments(body))])
        else:
            reasoning = self.reasoning and self.header.channel == harmony.REASONING and self.header.recipient is None
            keep = 0 if final or at >= 0 else _partial(self.buf, harmony.BODY_ENDS)
            text = self.buf[:at] if at >= 0 else self.buf[:len(self.buf) - keep]
            self._emit(out, **{"reasoning" if reasoning else "content": text})
            if at < 0:
                self.buf = self.buf[len(text):]
                return
        if at < 0:
            self.buf = ""
        else:  # a <|start|> with no <|end|> before it opens the next header
            self.buf = self.buf[at + (0 if tag == harmony.START else len(tag)):]
        self.state, self.header = _HEAD, None

    def _plain(self, out, final) -> None:
        self._emit(out, content=self.buf)
        self.buf = ""

    def _calls(self, out, calls) -> None:
        for name, arguments in calls:
            call = {"index": len(self.answer.tool_calls), "id": self.ids(self.fmt or HERMES), "type": "function",
                    "function": {"name": name, "arguments": arguments}}
            self.answer.tool_calls.append(call)
            out.append(Delta(tool_call=call))

    def _emit(self, out, reasoning: str = "", content: str = "") -> None:
        if reasoning:
            self.answer.reasoning += reasoning
            out.append(Delta(reasoning=reasoning))
        if content:
            self.answer.content += content
            out.append(Delta(content=content))


def _arguments(body: str) -> str:
    """A harmony call's arguments as JSON text: the body's object, written again, or the body as
    written where it is not one."""
    body = body.strip()
    try:
        value = json.loads(body)
    except ValueError:
        return body
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else body


def _partial(text: str, tags) -> int:
    """How many characters at the end of `text` may begin one of `tags`."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


def split(text: str, **kw) -> Answer:
    """The whole text, split at once (what any streaming of it adds up to)."""
    s = Splitter(**kw)
    s.push(text)
    s.finish()
    return s.answer
