"""Chat templates are untrusted programs: rendering one is bounded in time and in what it builds,
compiling one fails in one line, and the bounds change nothing a real template renders.

The deadline is tightened to 0.2 s here (real templates render in well under 10 ms); memory is
measured with tracemalloc where the claim is about memory.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from test_text import CHATML_TEMPLATE, byte_level, one_line, spec_of

from arcpy.errors import ModelFileError
from arcpy.text import chat_ids, limits, render_chat, sandbox

USER = [{"role": "user", "content": "a"}]


@pytest.fixture
def tight(monkeypatch):
    monkeypatch.setattr(limits, "DEADLINE_S", 0.2)


def refusal(template: str, messages=USER) -> tuple[str, float, int]:
    """(the one-line error, seconds taken, peak bytes allocated) of rendering `template`."""
    tracemalloc.start()
    try:
        start = time.perf_counter()
        with pytest.raises(ModelFileError) as e:
            render_chat(spec_of(byte_level(), template=template), messages)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = one_line(e)
    assert msg.startswith("chat template")
    return msg, seconds, peak


@pytest.mark.parametrize("template", [
    "{% for i in range(1000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    # no range at all: loops over a string
    "{% set s = 'x' * 1000000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    # 2**40 macro calls
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
    # the text of a macro, a block, a filter block: small pieces, forever
    "{% macro m() %}{% for i in range(1000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    "{% endmacro %}{{ m() | length }}",
])
def test_a_template_that_runs_too_long_stops_at_the_deadline(tight, template):
    msg, seconds, _ = refusal(template)
    assert "0.2 s" in msg and seconds < 1.5


@pytest.mark.parametrize("template", [
    "{{ (('x' * 1048576,) * 3000) | join | length }}",
    "{{ '%2000000000d' % 1 }}",
    "{{ '{:2000000000}'.format(1) }}",
    "{{ ('{:9000000}' * 100).format(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, *range(90)) }}",
    "{{ 'x' | center(2000000000) }}",
    "{{ 'a\\nb' | indent(2000000000) }}",
    "{{ 'ab' | replace('', 'x' * 1000000) | replace('x', 'y' * 1000) }}",
    "{{ '%2000000000s' | format('a') }}",
    "{{ 'a'.ljust(2000000000) }}",
    "{{ ('\\t' * 1000).expandtabs(10000000) }}",
    "{{ ('x' * 1000000).join(['a'] * 1000) }}",
    "{{ (1).to_bytes(2000000000, 'big') }}",
    "{{ [0] | batch(2000000000, 0) | list }}",
    "{{ [0] | slice(2000000000) | list }}",
    "{{ [[0] * 1000] * 1000 | sum(start=[]) }}",
    "{% set a = 'x' * 1000000 %}{% set b = a ~ a ~ a ~ a %}{% set c = b ~ b ~ b ~ b %}{{ (c ~ c ~ c ~ c) | length }}",
    # a list holding itself twice, sixty times over: 2**60 items for str() to write, or to hash
    "{% set ns = namespace(x=[0]) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x }}",
    "{% set ns = namespace(x=(0,)) %}{% for i in range(60) %}{% set ns.x = (ns.x, ns.x) %}{% endfor %}"
    "{{ {ns.x: 1} }}",
    "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x > 0 }}",
    "{{ messages | tojson(indent=1000000000) }}",
])
def test_a_template_that_would_build_too_much_is_refused_before_it_does(tight, template):
    msg, seconds, peak = refusal(template)
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    assert seconds < 1.5


def test_expensive_globals_and_html_filters_are_gone(tight):
    msg, seconds, _ = refusal("{{ lipsum(10 ** 6) }}")
    assert "lipsum" in msg and seconds < 1
    msg, seconds, _ = refusal("{{ ('<!--' * 100000) | striptags }}")
    assert "striptags" in msg and seconds < 1


def test_the_budget_grows_with_what_the_template_is_given(monkeypatch):
    monkeypatch.setattr(limits, "BUILD_BASE", 10_000)
    long = "word " * 100_000  # 50 times the base budget
    text = render_chat(spec_of(byte_level(), template=CHATML_TEMPLATE), [{"role": "user", "content": long}])
    assert text.count("word") == 100_000
    msg, _, _ = refusal("{{ 'x' * 20000 }}")
    assert "budget" in msg


# Filters, methods, operators, loops and blocks real templates use: jinja2's own sandbox renders
# the same text.
BEHAVING = [
    "{{ messages | map(attribute='content') | join(', ') }}|{{ messages | map(attribute='role') | list }}",
    "{% for m in messages %}{{ loop.index }}:{{ m.role | upper }}={{ m.content | trim | replace('a', 'A') }};"
    "{% if loop.last %}{{ loop.length }}{% endif %}{% endfor %}",
    "{{ '%s has %d' % (messages[0].role, messages | length) }}|{{ '{}-{:>5}'.format('x', 'y') }}|"
    "{{ '{a}'.format_map({'a': 1}) }}|{{ 'ab' ~ 1 ~ [2] }}|{{ 'ab' + 'c' }}|{{ [1] + [2] }}|{{ 'ab' * 3 }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|{{ [3, 1, 2] | sort | join }}|"
    "{{ range(5) | sum }}|{{ [1, 2] | sum(start=10) }}|{{ 2 ** 10 }}|{{ 7 % 3 }}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content | length %}{% endfor %}"
    "{{ ns.n }}|{{ ns }}",
    "{{ messages[1:] | length }}|{{ messages[::-1][0].content }}|{{ {'a': [1, (2, 3)], 'b': none} }}|"
    "{{ 'x' | center(7) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'ab'.center(6, '*') }}|{{ 'a\\tb'.expandtabs(4) }}",
    "{{ 'the quick brown fox' | wordwrap(9) }}|{{ [1, 2, 3, 4, 5] | batch(2, 0) | list }}|"
    "{{ [1, 2, 3] | slice(2) | list }}|{{ '%-4s|' | format('ab') }}|{{ 'abc' | list }}",
    "{% for x in [[1, [2]], [3]] recursive %}[{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}{% endif %}]"
    "{% endfor %}",
    "{% macro m(x) %}<{{ x }}>{% endmacro %}{% set s %}{{ m(1) }}{{ m(2) }}{% endset %}{{ s }}"
    "{% filter upper %}ab{{ 'c' }}{% endfilter %}{% macro w() %}[{{ caller() }}]{% endmacro %}"
    "{% call w() %}in{% endcall %}",
    "{{ messages[0] }}|{{ messages[0].content.split(' ') }}|{{ 'a b'.upper() }}|{{ '-'.join(['a', 'b']) }}|"
    "{{ messages[0].items() | list }}|{{ dict(a=1) }}|{{ undefined_name }}|{{ none }}|{{ 1.5 }}",
    "{% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}{{ v }}{% else %}empty{% endfor %}"
    "{% for x in [] %}{% else %}empty{% endfor %}{% for i in range(9) %}{% if i > 2 %}{% break %}{% endif %}"
    "{{ i }}{% endfor %}{{ cycler('a', 'b').next() }}",
]


@pytest.mark.parametrize("template", BEHAVING)
def test_the_bounds_change_nothing_a_template_renders(template):
    messages = [{"role": "user", "content": "a banana"}, {"role": "assistant", "content": " ok "}]
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    expected = plain.from_string(template).render(messages=messages, add_generation_prompt=True)
    assert render_chat(spec_of(byte_level(), template=template), messages) == expected


@pytest.mark.parametrize("template, expected", [
    ("{% for a in x %}" * 21 + "{% endfor %}" * 21, "SyntaxError"),   # Python's limit of 20 nested blocks
    ("{% if x %}" * 120 + "{% endif %}" * 120, "IndentationError"),  # and of 100 levels of indentation
    ("{% if x %}" * 1000 + "{% endif %}" * 1000, "RecursionError"),
    ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "RecursionError"),
], ids=["21 nested loops", "120 nested ifs", "1000 nested ifs", "5000 parentheses"])
def test_a_template_python_cannot_compile_is_one_model_file_error(template, expected):
    with pytest.raises(ModelFileError) as e:
        render_chat(spec_of(byte_level(), template=template), USER)
    msg = one_line(e)
    assert msg.startswith("chat template") and expected in msg


def test_running_out_of_memory_while_compiling_is_one_model_file_error(monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(sandbox._ENV, "parse", out_of_memory)
    with pytest.raises(ModelFileError) as e:
        render_chat(spec_of(byte_level(), template="{{ 'never compiled before' }}"), USER)
    assert "MemoryError" in one_line(e)


# ---------------------------------------------------------------------------------------------
# what a template may cost before it renders: its size, and its compile


@pytest.mark.parametrize("template", [
    "{{ 'x' }}" * (2**20 // 9),                     # 1 MiB: 40 s and more to compile without the bounds
    "{{ m }}" * (2**23 // 7),                       # 8 MiB
    "{% if 1 %}x{% endif %}" * 200_000,
])
def test_a_template_larger_than_any_real_one_is_refused_at_once(template):
    msg, seconds, _ = refusal(template)
    assert f"{len(template):,} characters is more than a chat template may have" in msg
    assert f"({limits.MAX_TEMPLATE_CHARS:,};" in msg and seconds < 0.5


@pytest.mark.parametrize("unit", ["{{ 'x' }}", "{{ m }}", "{% if 1 %}x{% endif %}"])
def test_a_template_whose_compile_runs_too_long_stops_at_the_compile_deadline(monkeypatch, unit):
    monkeypatch.setattr(limits, "COMPILE_DEADLINE_S", 0.05)
    template = unit * (limits.MAX_TEMPLATE_CHARS // len(unit))  # under the size limit: ~1 s to compile here
    msg, seconds, _ = refusal(template)
    assert msg == "chat template: compiling took longer than its limit of 0.05 s" and seconds < 0.5


def test_a_template_that_writes_a_lone_surrogate_is_one_model_file_error():
    """Python's str holds the half of a pair that `'\\ud800'` writes; no tokenizer takes it."""
    spec = spec_of(byte_level(), template="{{ 'a' }}{{ '\\ud800' }}")
    for make in (render_chat, chat_ids):
        with pytest.raises(ModelFileError) as e:
            make(spec, USER)
        assert one_line(e) == "chat template: it wrote text that is not valid Unicode (surrogates not allowed at index 1)"
