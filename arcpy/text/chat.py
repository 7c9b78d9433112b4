"""Chat messages -> prompt text, through the model's Jinja chat template.

The template runs in arcpy.text.sandbox: jinja2's immutable sandbox, bounded in time and in what it
builds. It sees the names Hugging Face templates use: messages, add_generation_prompt, bos_token
and eos_token (where the model has them).

`chat_ids` is the prompt to decode: the template's markup becomes the model's control tokens, and
the messages' own text stays text, whatever it holds (arcpy.text.specials). `render_chat` is the
same prompt as text, to show.
"""

from __future__ import annotations

from arcpy.checks import quoted
from arcpy.errors import InvalidArgumentError
from arcpy.text.codec import led_by_bos
from arcpy.text.sandbox import render_template
from arcpy.text.spec import TextSpec
from arcpy.text.specials import Marks

__all__ = ["chat_ids", "render_chat"]


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
        for key, text in (("role", role), ("content", content)):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:  # a lone surrogate: no tokenizer takes it
                raise InvalidArgumentError(f"messages[{i}]: '{key}' is not valid Unicode "
                                           f"({e.reason} at index {e.start})") from None
        out.append({"role": role, "content": content})
    return out


def render_chat(spec: TextSpec, messages, add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]) by the model's chat
    template, ending with the assistant's header when `add_generation_prompt`. To show: the ids
    to decode are `chat_ids`."""
    return render_template(spec.chat_template, _context(spec, messages, add_generation_prompt))


def chat_ids(spec: TextSpec, messages, add_generation_prompt: bool = True) -> list[int]:
    """The prompt's token ids for `messages`, led by BOS where the model wants it and the template
    wrote none. The template's markup becomes control tokens; a special-token string inside a
    message ('<|im_start|>' typed by a user) is encoded as the characters it is, as though the
    tokenizer did not know it. Messages without one give exactly
    encode(spec, render_chat(spec, messages), parse_special=True)."""
    context = _context(spec, messages, add_generation_prompt)
    given = [context.get("bos_token") or "", context.get("eos_token") or ""]
    given += [text for m in context["messages"] for text in m.values()]
    marks = Marks(spec.tokenizer, [spec.chat_template, *given])
    for m in context["messages"]:
        m["role"], m["content"] = marks.mark(m["role"]), marks.mark(m["content"])
    ids = marks.encode(render_template(spec.chat_template, context))
    return led_by_bos(spec, ids, spec.add_bos)


def _context(spec: TextSpec, messages, add_generation_prompt) -> dict:
    """What the template sees."""
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
    return context
