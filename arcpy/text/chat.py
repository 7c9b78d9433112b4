"""Chat messages -> prompt text, through the model's Jinja chat template.

The template runs in arcpy.text.sandbox: jinja2's immutable sandbox, bounded in time and in what it
builds. It sees the names Hugging Face templates use: messages, add_generation_prompt, bos_token
and eos_token (where the model has them).
"""

from __future__ import annotations

from arcpy.checks import quoted
from arcpy.errors import InvalidArgumentError
from arcpy.text.sandbox import render_template
from arcpy.text.spec import TextSpec

__all__ = ["render_chat"]


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
    return render_template(spec.chat_template, _context(spec, messages, add_generation_prompt))


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
