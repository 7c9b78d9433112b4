"""The tokens a scripted forward writes, the oracle of the loop's tests: a rule of (token,
position) followed from a start, by default arcpy.devices.scripted's."""

from __future__ import annotations

from typing import Callable

from arcpy.devices.scripted import scripted_next


def following(rule: Callable[[int, int], int], token: int, position: int, n: int) -> list[int]:
    """The `n` tokens after `token` at `position`, each `rule(previous, its position)`."""
    out = []
    for _ in range(n):
        token = rule(token, position)
        position += 1
        out.append(token)
    return out


def scripted_tokens(prompt, n: int, vocab: int, bias: int = 3) -> list[int]:
    """The `n` tokens the scripted model writes after `prompt` (its last token at its last position)."""
    return following(lambda t, p: scripted_next(t, p, vocab, bias), prompt[-1], len(prompt) - 1, n)
