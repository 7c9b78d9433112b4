"""The environment chat templates run in: jinja2's immutable sandbox, bounded in time and in size.

A template comes from the model's files, so it is untrusted input. The sandbox is made stricter:
touching an unsafe attribute (`''.__class__`) is an error, not an empty string. And it is bounded
(arcpy.text.limits): the sandbox's hooks (attribute access, calls, the operators `+ * ** %`, str's
format) and every filter check the deadline and pay for what they build. What no hook sees is
routed through filters that do when the template compiles: each loop's items (a loop of loops
stops on time), each piece of output (a macro's or a block's text is paid for as it is written),
`~`, and list, tuple and dict displays (no display nests a value past the budget).

The names Hugging Face templates use are there, with the same environment options (trim_blocks,
lstrip_blocks, loop controls, `{% generation %}`): raise_exception, strftime_now, and a tojson that
writes JSON the way json.dumps does. `lipsum` is gone (slow, and no prompt needs it), and so are
the HTML filters (pprint, striptags, urlize, xmlattr), one of them quadratic in its input.
"""

from __future__ import annotations

import datetime
import functools
import json
import types

from jinja2 import TemplateSyntaxError, nodes, pass_context
from jinja2.compiler import CodeGenerator
from jinja2.ext import Extension
from jinja2.filters import FILTERS, make_attrgetter
from jinja2.runtime import LoopContext
from jinja2.sandbox import (ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter,
                            SecurityError)
from jinja2.visitor import NodeTransformer
from markupsafe import Markup

from arcpy.checks import quoted
from arcpy.errors import ArcError, InvalidArgumentError, ModelFileError

from arcpy.text.limits import (MAX_INT_BITS, CompileClock, Limits, TemplateLimit, check_template_size, compile_tick,
                               current, digits, replaced, whole)

MAX_PROMPT_CHARS = 16 * 1024 * 1024  # far past any context window
_MAX_INDENT = 64                     # the widest tojson indent
_DROPPED = ("pprint", "striptags", "urlize", "xmlattr")


class _Raised(Exception):
    """raise_exception() from inside a template: the template refuses the conversation."""


def _raise_exception(message):
    raise _Raised(message)


def _strftime_now(fmt):
    if not isinstance(fmt, str) or len(fmt) > 256:
        raise SecurityError("strftime_now takes a format string of at most 256 characters")
    return datetime.datetime.now().strftime(fmt)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """JSON as json.dumps writes it, paid for as it is written."""
    if isinstance(indent, int) and indent > _MAX_INDENT or isinstance(indent, str) and len(indent) > _MAX_INDENT:
        raise SecurityError(f"tojson: an indent wider than {_MAX_INDENT} is not allowed")
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                               sort_keys=sort_keys)
    limits = current()
    if limits is None:
        return encoder.encode(value)
    chunks = []
    for chunk in limits.iterate(encoder.iterencode(value)):
        limits.spend(len(chunk))
        chunks.append(chunk)
    return "".join(chunks)


@pass_context
def _join(context, value, d="", attribute=None):
    """The join filter, measured before it joins."""
    if attribute is not None:
        value = map(make_attrgetter(context.environment, attribute), value)
    sep = d if isinstance(d, str) else str(d)
    limits = current()
    if limits is None:
        return sep.join(map(str, value))
    parts = [limits.stringify(x) for x in limits.iterate(value)]
    limits.spend(sum(map(len, parts)) + len(sep) * max(len(parts) - 1, 0))
    return sep.join(parts)


# Checks of the filters that can build far more than they are given, on the filters' own arguments.

def _center(limits, value, width=80):
    limits.need(limits.text(value) + whole(width))


def _indent(limits, s, width=4, first=False, blank=False):
    pad = len(width) if isinstance(width, str) else whole(width)
    lines = s.count("\n") + 1 if isinstance(s, str) else limits.text(s)
    limits.need(limits.text(s) + lines * pad)


def _wordwrap(limits, s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True):
    wrap = len(wrapstring) if isinstance(wrapstring, str) else 1
    limits.need(limits.text(s) * (1 + wrap) + wrap)


def _replace(limits, s, old, new, count=None):
    text = limits.stringify
    limits.need(replaced(text(s), text(old), text(new), -1 if count is None else count))


def _format(limits, value, *args, **kwargs):
    limits.need(limits.printf(limits.stringify(value), kwargs or args))


def _batch(limits, value, linecount, fill_with=None):
    if fill_with is not None:
        limits.need(whole(linecount))


def _slice(limits, value, slices, fill_with=None):
    limits.need(whole(slices))


def _list(limits, value):
    if isinstance(value, (str, bytes, range, list, tuple, dict)):
        limits.need(len(value))


def _sum(limits, iterable, attribute=None, start=0):
    if not isinstance(start, (int, float)):
        raise SecurityError("the sum filter adds numbers only")


_CHECKS = {"center": _center, "indent": _indent, "wordwrap": _wordwrap, "replace": _replace, "format": _format,
           "batch": _batch, "slice": _slice, "list": _list, "sum": _sum}


def _guarded(f, check=None, pay=True):
    """Filter `f` under the render's limits: the deadline, then `check` on its arguments, then
    what it returns paid for (unless it pays as it goes)."""
    kind = getattr(getattr(f, "jinja_pass_arg", None), "name", None)

    @pass_context  # also keeps jinja2 from running it at compile time, outside any limits
    def guarded(context, value, *args, **kwargs):
        limits = current()
        if limits is not None:
            limits.tick()
            if check is not None:
                check(limits, value, *args, **kwargs)
        lead = {"context": (context,), "eval_context": (context.eval_ctx,),
                "environment": (context.environment,)}.get(kind, ())
        result = f(*lead, value, *args, **kwargs)
        return limits.built(result) if limits is not None and pay else result

    return guarded


# The filters that _Guard routes what the sandbox cannot see through.

@pass_context
def _loop_items(context, value):
    limits = current()
    return value if limits is None else limits.iterate(value)


@pass_context
def _output(context, value):
    limits = current()
    if limits is None:
        return value
    limits.tick()
    text = limits.stringify(value)
    limits.spend(len(text) + 1)  # and a slot in the buffer that holds it
    return text


@pass_context
def _concat(context, values):
    limits = current()
    if limits is None:
        return "".join(map(str, values))
    limits.tick()
    parts = [limits.stringify(v) for v in values]
    limits.spend(sum(map(len, parts)))
    return "".join(parts)


@pass_context
def _display(context, value):
    limits = current()
    return value if limits is None else limits.built(value, deep=False)


def _through(node: nodes.Expr, name: str) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


class _Guard(NodeTransformer):
    """Routes through the filters above what the sandbox's hooks do not see."""

    def visit(self, node, *args, **kwargs):
        compile_tick()
        return super().visit(node, *args, **kwargs)

    def visit_For(self, node):
        self.generic_visit(node)
        node.iter = _through(node.iter, "_arc_loop_items")
        return node

    def visit_Output(self, node):
        self.generic_visit(node)
        node.nodes = [_through(nodes.Const(c.data, lineno=c.lineno) if isinstance(c, nodes.TemplateData) else c,
                               "_arc_output") for c in node.nodes]
        return node

    def visit_Concat(self, node):
        self.generic_visit(node)
        return _through(nodes.List(node.nodes, lineno=node.lineno), "_arc_concat")

    def visit_display(self, node):
        self.generic_visit(node)
        return node if getattr(node, "ctx", "load") != "load" else _through(node, "_arc_display")

    visit_List = visit_Tuple = visit_Dict = visit_display


class _Generation(Extension):
    """{% generation %}...{% endgeneration %} marks the assistant's text for training masks;
    rendering a prompt only needs the body."""

    tags = {"generation"}

    def parse(self, parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    def filter_stream(self, stream):
        """The lexer's tokens, as it makes them, each looking at the compile's clock."""
        for token in stream:
            compile_tick()
            yield token


class _TimedCodeGenerator(CodeGenerator):
    def visit(self, node, *args, **kwargs):
        compile_tick()
        return super().visit(node, *args, **kwargs)


class _FieldsPaid:
    """A formatter for str.format that measures each field before it writes it."""

    def format_field(self, value, format_spec):
        limits = current()
        if limits is None:
            return super().format_field(value, format_spec)
        limits.tick()
        limits.need(limits.text(value) + digits(format_spec))
        field = super().format_field(value, format_spec)
        limits.spend(len(field))
        return field


class _Formatter(_FieldsPaid, SandboxedFormatter):
    pass


class _EscapeFormatter(_FieldsPaid, SandboxedEscapeFormatter):
    pass


def _sized_call(limits, obj, args, kwargs) -> tuple:
    """Refuse a call of a str (or int) method that would build more than the budget has left;
    the call's arguments, with an iterable to join made a list."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", None)
    if isinstance(owner, (str, bytes)):
        if name in ("center", "ljust", "rjust", "zfill") and args:
            limits.need(len(owner) + whole(args[0]))
        elif name == "expandtabs":
            tabs = owner.count("\t" if isinstance(owner, str) else b"\t")
            limits.need(len(owner) + tabs * whole(args[0] if args else kwargs.get("tabsize", 8)))
        elif name == "replace" and len(args) >= 2:
            limits.need(replaced(owner, *args[:3]))
        elif name == "join" and args:
            items = list(limits.iterate(args[0]))
            sizes = sum(len(x) for x in items if isinstance(x, (str, bytes)))
            limits.need(sizes + len(owner) * max(len(items) - 1, 0))
            args = (items, *args[1:])
        elif name == "translate":
            raise SecurityError("str.translate is not allowed")
    elif isinstance(owner, int) and name == "to_bytes":
        limits.need(whole(args[0] if args else kwargs.get("length", 1)))
    return args


def _operands_size(limits, operator, left, right) -> int:
    """At most how many characters (or items) `left <operator> right` builds."""
    if operator == "**":
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() * right > MAX_INT_BITS:
            raise SecurityError(f"{quoted(left, 20)} ** {quoted(right, 20)} is too large (at most {MAX_INT_BITS} bits)")
    elif operator == "%":
        return limits.printf(left, right) if isinstance(left, str) else 0
    elif operator == "+":
        seqs = (str, bytes, list, tuple)
        return len(left) + len(right) if isinstance(left, seqs) and isinstance(right, seqs) else 0
    elif operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                return (len(seq) if isinstance(seq, (str, bytes)) else limits.weigh(seq)) * whole(n)
        bits = left.bit_length() + right.bit_length() if isinstance(left, int) and isinstance(right, int) else 0
        if bits > MAX_INT_BITS:
            raise SecurityError(f"a product of {bits} bits is too large (at most {MAX_INT_BITS})")
    return 0


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(("+", "*", "**", "%"))

    def unsafe_undefined(self, obj, attribute):
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} is not allowed")

    def call_binop(self, context, operator, left, right):
        limits = current()
        if limits is None:
            return super().call_binop(context, operator, left, right)
        limits.tick()
        if operator == "+" and type(left) is str and type(right) is str:  # what templates do most
            limits.spend(len(left) + len(right))
            return left + right
        limits.need(_operands_size(limits, operator, left, right))
        return limits.built(super().call_binop(context, operator, left, right), deep=False)

    def getattr(self, obj, attribute):
        limits = current()
        if limits is not None:
            limits.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        limits = current()
        if limits is not None:
            limits.tick()
        value = super().getitem(obj, argument)
        if limits is not None and isinstance(argument, slice):  # a slice is a copy
            limits.built(value, deep=False)
        return value

    def call(self, context, obj, /, *args, **kwargs):
        limits = current()
        if limits is not None:
            limits.tick()
            if isinstance(obj, LoopContext) and args:  # loop(children) inside a recursive loop
                args = (limits.iterate(args[0]), *args[1:])
            args = _sized_call(limits, obj, args, kwargs)
        result = super().call(context, obj, *args, **kwargs)
        return result if limits is None else limits.built(result)

    def wrap_str_format(self, value):
        """str.format and str.format_map, through a formatter that pays for each field."""
        if not (isinstance(value, (types.MethodType, types.BuiltinMethodType))
                and value.__name__ in ("format", "format_map") and isinstance(value.__self__, str)):
            return None
        fmt, as_map = value.__self__, value.__name__ == "format_map"
        formatter = _EscapeFormatter(self, escape=fmt.escape) if isinstance(fmt, Markup) else _Formatter(self)

        def format_(*args, **kwargs):
            if as_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                args, kwargs = (), args[0]
            return type(fmt)(formatter.vformat(fmt, args, kwargs))

        return format_

    def concat(self, pieces):
        """The text of a block, a macro or a `{% set %}`: the copy is paid for too."""
        limits = current()
        if limits is None:
            return "".join(pieces)
        pieces = list(pieces)
        limits.tick()
        limits.spend(sum(map(len, pieces)))
        return "".join(pieces)


_ENV = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _Generation])
_ENV.code_generator_class = _TimedCodeGenerator
del _ENV.globals["lipsum"]
_ENV.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
GLOBALS = frozenset(_ENV.globals)  # the names every template sees besides its context
_ENV.filters = {name: _guarded(f, _CHECKS.get(name)) for name, f in FILTERS.items() if name not in _DROPPED}
_ENV.filters.update(join=_guarded(_join, pay=False), tojson=_guarded(_tojson, pay=False),
                    _arc_loop_items=_loop_items, _arc_output=_output, _arc_concat=_concat,
                    _arc_display=_display)


@functools.lru_cache(maxsize=8)
def compile_template(source: str):
    """The template of `source`, guarded, within its size and compile deadline (arcpy.text.limits);
    any failure is one ModelFileError."""
    check_template_size(source)
    try:
        with CompileClock():
            tree = _Guard().visit(_ENV.parse(source))
            tree.set_environment(_ENV)
            return _ENV.from_string(tree)
    except TemplateSyntaxError as e:
        raise ModelFileError(f"chat template: line {e.lineno}: {quoted(e.message or '', 160)}") from None
    except TemplateLimit as e:
        raise ModelFileError(f"chat template: {e}") from None
    except Exception as e:  # Python's compiler on the generated code: blocks nested too deep, recursion, memory
        detail = f": {quoted(str(e), 160)}" if str(e) else ""
        raise ModelFileError(f"chat template: does not compile ({type(e).__name__}{detail})") from None


def render_template(source: str, context: dict) -> str:
    """The text of the template `source` given `context`, within the limits of arcpy.text.limits."""
    template = compile_template(source)
    pieces, size = [], 0
    try:
        with Limits(context):
            for piece in template.generate(context):
                size += len(piece)
                if size > MAX_PROMPT_CHARS:
                    raise ModelFileError(f"chat template: the prompt passed {MAX_PROMPT_CHARS} characters")
                pieces.append(piece)
    except _Raised as e:
        raise InvalidArgumentError(f"chat template refused the messages: {quoted(str(e), 200)}") from None
    except ArcError:
        raise
    except TemplateLimit as e:
        raise ModelFileError(f"chat template: {e}") from None
    except SecurityError as e:
        raise ModelFileError(f"chat template broke the sandbox's rules: {quoted(str(e), 160)}") from None
    except Exception as e:  # a template bug: undefined filter, wrong types, recursion, memory...
        raise ModelFileError(f"chat template failed: {type(e).__name__}: {quoted(str(e), 160)}") from None
    text = "".join(pieces)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate ('\ud800' in the template): no tokenizer takes it
        raise ModelFileError(f"chat template: it wrote text that is not valid Unicode ({e.reason} at index "
                             f"{e.start})") from None
    return text
