"""Chat messages -> prompt text, through the model's Jinja chat template.

A template comes from the model's files, so it is untrusted input. It runs in jinja2's immutable
sandbox, made stricter: touching an unsafe attribute (`''.__class__`) is an error, not an empty
string, and `*` and `**` may not build anything huge. The names Hugging Face templates use are
there, with the same environment options (trim_blocks, lstrip_blocks, loop controls,
`{% generation %}`): messages, add_generation_prompt, bos_token, eos_token, raise_exception,
strftime_now, and a tojson that writes JSON the way json.dumps does.
"""

from __future__ import annotations

import datetime
import functools
import json

from jinja2 import TemplateSyntaxError, nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from arcpy.checks import quoted
from arcpy.errors import ArcError, InvalidArgumentError, ModelFileError
from arcpy.text.spec import TextSpec

MAX_PROMPT_CHARS = 16 * 1024 * 1024  # far past any context window; a runaway template stops here
_MAX_REPEAT = 1024 * 1024            # items one `*` may build
_MAX_POWER_BITS = 4096               # bits one `**` may build


class _Raised(Exception):
    """raise_exception() from inside a template: the template refuses the conversation."""


def _raise_exception(message):
    raise _Raised(message)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class _Generation(Extension):
    """{% generation %}...{% endgeneration %} marks the assistant's text for training masks;
    rendering a prompt only needs the body."""

    tags = {"generation"}

    def parse(self, parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(("*", "**"))

    def unsafe_undefined(self, obj, attribute):
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} is not allowed")

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > _MAX_REPEAT:
                    raise SecurityError(f"a {type(seq).__name__} repeated {n} times is too long")
        elif isinstance(left, int) and isinstance(right, int) and left.bit_length() * right > _MAX_POWER_BITS:
            raise SecurityError(f"{left} ** {right} is too large")
        return super().call_binop(context, operator, left, right)


_ENV = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _Generation])
_ENV.filters["tojson"] = _tojson
_ENV.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)


@functools.lru_cache(maxsize=8)
def _compile(source: str):
    try:
        return _ENV.from_string(source)
    except TemplateSyntaxError as e:
        raise ModelFileError(f"chat template: line {e.lineno}: {quoted(e.message or '', 160)}") from None


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidArgumentError("messages must be a non-empty list of {'role': str, 'content': str} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidArgumentError(f"messages[{i}] must be a dict with 'role' and 'content', "
                                       f"got {type(m).__name__}")
        extra = [k for k in m if k not in ("role", "content")]
        if extra:
            raise InvalidArgumentError(f"messages[{i}]: unsupported key {quoted(extra[0])} "
                                       "(a message has 'role' and 'content')")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise InvalidArgumentError(f"messages[{i}]: 'role' must be a non-empty string, got {quoted(role)}")
        if not isinstance(content, str):
            raise InvalidArgumentError(f"messages[{i}]: 'content' must be a string, got {quoted(content)}")
        out.append({"role": role, "content": content})
    return out


def render_chat(spec: TextSpec, messages, add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]) by the model's chat
    template, ending with the assistant's header when `add_generation_prompt`. Encode it with
    `encode`, which adds BOS only where the template did not write one."""
    if spec.chat_template is None:
        raise InvalidArgumentError("this model has no chat template: give it a plain-text prompt")
    if not isinstance(add_generation_prompt, bool):
        raise InvalidArgumentError(f"add_generation_prompt must be True or False, got {quoted(add_generation_prompt)}")
    context = {"messages": _check_messages(messages), "add_generation_prompt": add_generation_prompt}
    # A token the model lacks stays undefined, as in transformers: `bos_token is defined` holds.
    if spec.bos_id is not None:
        context["bos_token"] = spec.token_text(spec.bos_id)
    if spec.eos_ids:
        context["eos_token"] = spec.token_text(spec.eos_ids[0])
    template = _compile(spec.chat_template)
    pieces, size = [], 0
    try:
        for piece in template.generate(context):
            size += len(piece)
            if size > MAX_PROMPT_CHARS:
                raise ModelFileError(f"chat template: the prompt passed {MAX_PROMPT_CHARS} characters")
            pieces.append(piece)
    except _Raised as e:
        raise InvalidArgumentError(f"chat template refused the messages: {quoted(str(e), 200)}") from None
    except ArcError:
        raise
    except SecurityError as e:
        raise ModelFileError(f"chat template broke the sandbox's rules: {quoted(str(e), 160)}") from None
    except Exception as e:  # a template bug: undefined filter, wrong types, recursion...
        raise ModelFileError(f"chat template failed: {type(e).__name__}: {quoted(str(e), 160)}") from None
    return "".join(pieces)
