"""What one chat-template render may spend: a deadline, and a budget for what it builds.

A chat template is a program from the model's files. jinja2's sandbox keeps it away from Python's
internals, but not from running forever or from filling memory. The sandbox (arcpy.text.sandbox)
calls these limits from its hooks: every loop iteration, call, attribute access, operator and
filter checks the deadline, and everything the template builds (a string, a container, the text
of a block) is paid for out of the budget: before it is built wherever its size can be told
beforehand (`'x' * n`, `'%9999d' % 1`, `center(n)`, `join`), right after otherwise.

Sizes are weights. A string weighs its characters; a container what str() writes of it, each
shared item counted every time it is reached (a list that holds one list twice weighs that list
twice). No value a template builds may weigh more than the whole budget, so no walk that Python
makes of it in C (str, hash, ==, sort, JSON) is longer than the budget, wherever the template
makes it; the render as a whole may not build more than the budget either.
"""

from __future__ import annotations

import re
import threading
import time

from jinja2.utils import Namespace

from arcpy.errors import ModelFileError

DEADLINE_S = 2.0                 # seconds a render may take; real templates take well under 10 ms
MAX_TEMPLATE_CHARS = 128 * 1024  # a template's size: llama.cpp's 70 real ones are 0.2 to 16.7 KB
COMPILE_DEADLINE_S = 2.0         # seconds a compile may take: those 70 take under 0.1 s each
BUILD_BASE = 8 * 1024 * 1024     # characters any render may build...
BUILD_PER_INPUT = 16             # ...plus this many times the weight of what it is given
MAX_INT_BITS = 4096              # the largest integer `*` or `**` may make
_OPAQUE = 100                    # the weight of an object without items: a loop, a macro, a range
_STEPS = 4096                    # a long walk looks at the clock this often

_FROZEN = (list, tuple, dict, set, frozenset)  # containers the immutable sandbox cannot change
_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))
_CONTAINERS = (*_FROZEN, Namespace, *_VIEWS)
_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?")


class TemplateLimit(Exception):
    """A render ran out of time or of budget."""


_local = threading.local()


def current() -> Limits | None:
    """The limits of the render running on this thread, or None outside a render (compilation)."""
    return getattr(_local, "limits", None)


def whole(n) -> int:
    """An integer argument, as a size (anything else counts as nothing: the call itself refuses it)."""
    return max(int(n), 0) if isinstance(n, int) else 0


def digits(spec: str) -> int:
    """The sum of the numbers in a format spec: at least the width or precision it asks for."""
    return sum(int(d) if len(d) < 10 else 1 << 62 for d in re.findall(r"\d+", spec))


def check_template_size(source: str, where: str = "chat template") -> str:
    """`source`, if it is no larger than a template may be (a ModelFileError naming `where` if not)."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise ModelFileError(f"{where}: {len(source):,} characters is more than a chat template may have "
                             f"({MAX_TEMPLATE_CHARS:,}; real ones have a few thousand to tens of thousands)")
    return source


class CompileClock:
    """The deadline of one compile, on the thread that runs it: `with CompileClock():` around it.
    The lexer's tokens, the sandbox's rewrite and the code generator's nodes each tick it; what
    Python's compiler then does is bounded by the size of what they made."""

    def __init__(self):
        self.seconds = COMPILE_DEADLINE_S
        self.deadline = time.monotonic() + self.seconds

    def __enter__(self) -> CompileClock:
        _local.compiling = self
        return self

    def __exit__(self, *exc) -> None:
        _local.compiling = None

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimit(f"compiling took longer than its limit of {self.seconds:g} s")


def compile_tick() -> None:
    """Look at the clock of the compile running on this thread, if any."""
    clock = getattr(_local, "compiling", None)
    if clock is not None:
        clock.tick()


class Limits:
    """The limits of one render, on the thread that runs it: `with Limits(given):` around it.
    `given` is what the template is handed (the messages and the other names); the budget grows
    with it."""

    def __init__(self, given):
        self.seconds = DEADLINE_S
        self.deadline = time.monotonic() + self.seconds
        self._memo: dict[int, tuple[object, int]] = {}  # id -> (the container, kept alive; weight)
        self.total = 1 << 62
        self.total = BUILD_BASE + BUILD_PER_INPUT * self.weigh(given)
        self.left = self.total

    def __enter__(self) -> Limits:
        _local.limits = self
        return self

    def __exit__(self, *exc) -> None:
        _local.limits = None
        self._memo.clear()

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimit(f"rendering took longer than its limit of {self.seconds:g} s")

    def need(self, n: int) -> None:
        """Refuse what would build `n` more characters than the budget has left."""
        if n > self.left:
            self.left = -1  # refused once, refused from then on
            raise TemplateLimit(f"it builds more than its budget of {self.total:,} characters")

    def spend(self, n: int) -> None:
        self.need(n)
        self.left -= n

    def built(self, value, deep: bool = True):
        """Pay for `value`, just built: a string by its length; a container by its weight when
        `deep` (what a filter or a method returns may hold new strings), else by its items (a
        display, an operator: its items are paid for already). Returns `value`."""
        if isinstance(value, (str, bytes)):
            self.spend(len(value))
        elif isinstance(value, _CONTAINERS):
            w = self.weigh(value)
            if w > self.total:
                self.left = -1
                raise TemplateLimit(f"it builds a value larger than its budget of {self.total:,} characters")
            self.spend(w if deep else len(_items(value)) + 1)
        else:
            self.spend(1)
        return value

    def text(self, value) -> int:
        """At most how many characters str(value) writes."""
        return len(value) if isinstance(value, str) else self.weigh(value)

    def stringify(self, value) -> str:
        """str(value), paid for; what it would write is measured before it is written."""
        if isinstance(value, str):
            return value
        self.need(self.weigh(value))
        text = str(value)
        self.spend(len(text))
        return text

    def iterate(self, items):
        """`items`, looking at the clock before each one: a loop of loops stops on time."""
        for item in items:
            self.tick()
            yield item

    def weigh(self, value) -> int:
        """At most how many characters str() writes of `value` (see the module's docstring);
        anything past the budget reads as just past it. Remembered for the containers that the
        sandbox keeps from changing, so building a list around a big one is cheap."""
        w = _leaf(value)
        if w is not None:
            return w
        memo, local, cap = self._memo, {}, self.total + 1
        stack, path, steps = [(value, False)], set(), 0
        while stack:
            node, ready = stack.pop()
            key = id(node)
            steps += 1
            if steps % _STEPS == 0:
                self.tick()
            if not ready:
                if key in memo or key in local or key in path:
                    continue
                path.add(key)
                stack.append((node, True))
                stack.extend((c, False) for c in _items(node) if isinstance(c, _CONTAINERS))
                continue
            total = 16
            for child in _items(node):
                c = _leaf(child)
                if c is None:  # a container on the path is a cycle: str() writes it as '...'
                    k = id(child)
                    c = memo[k][1] if k in memo else local.get(k, _OPAQUE)
                total = min(total + c + 4, cap)
            path.discard(key)
            if type(node) in _FROZEN:
                memo[key] = (node, total)
            else:
                local[key] = total
        key = id(value)
        return memo[key][1] if key in memo else local[key]

    def printf(self, fmt, args) -> int:
        """At most how many characters `fmt % args` writes."""
        size = len(fmt)
        for m in _PRINTF.finditer(fmt):
            if "*" in m.groups(""):
                raise TemplateLimit("a '*' width in % formatting is not allowed")
            size += sum(digits(g) for g in m.groups("") if g)
        values = args.values() if isinstance(args, dict) else args if isinstance(args, tuple) else (args,)
        return size + sum(self.text(v) for v in values)


def replaced(s, old, new, count=-1) -> int:
    """The length of s.replace(old, new, count), without making it."""
    if not (isinstance(s, (str, bytes)) and type(old) is type(new) is type(s)):
        return len(s) if isinstance(s, (str, bytes)) else 0
    found = len(s) + 1 if not old else s.count(old)
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(s) + max(found * (len(new) - len(old)), 0)


def _leaf(x) -> int | None:
    """The weight of a value without items (None for a container)."""
    if isinstance(x, str):
        return 2 * len(x) + 2 if x.isprintable() else 10 * len(x) + 2  # repr's escapes
    if isinstance(x, bool) or x is None:
        return 5
    if isinstance(x, int):
        return x.bit_length() // 3 + 2
    if isinstance(x, float):
        return 24
    if isinstance(x, bytes):
        return 4 * len(x) + 3
    if isinstance(x, _CONTAINERS):
        return None
    return _OPAQUE


def _items(x):
    """What str() of a container writes: its items; a mapping's keys and values."""
    if isinstance(x, Namespace):
        x = object.__getattribute__(x, "_Namespace__attrs")
    if isinstance(x, dict):
        return [v for kv in dict.items(x) for v in kv]
    if isinstance(x, type({}.items())):
        return [v for kv in x for v in kv]
    return x
