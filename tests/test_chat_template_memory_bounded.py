"""A chat template cannot make Parley allocate without bound: growth stops at a character budget, at once.

A probe of issue 25 rendered a template that doubles a string in a loop: 3.58 GB of memory before the 10 s
time limit. Each template below grows a string or list (or asks for one) far past the limits, which are
lowered here to 64 K characters per value and 256 K built per render, so that a template escaping them
allocates a few MB, never gigabytes, even where the bound is broken on purpose (scripts/mutants.py). Each
must fail with the template named; the time limit is an hour, so only the memory bounds can stop them."""

from __future__ import annotations

import pytest

from parley.models import chat_template

MESSAGES = [{"role": "user", "content": "hi"}]
HOUR = 3600.0


@pytest.fixture(autouse=True)
def small_limits(monkeypatch):
    monkeypatch.setattr(chat_template, "MAX_OUTPUT", 1 << 16)
    monkeypatch.setattr(chat_template, "MAX_BUILT", 1 << 18)
    monkeypatch.setattr(chat_template, "MAX_SIZE_ARGUMENT", 1 << 16)


def doubling(step: str, start: str = "'ab'") -> str:
    return (f"{{% set ns = namespace(s={start}) %}}{{% for i in range(22) %}}{{% set ns.s = {step} %}}"
            "{% endfor %}{{ ns.s|length }}")


@pytest.mark.parametrize("template", [
    doubling("ns.s + ns.s"),
    doubling("ns.s ~ ns.s"),
    doubling("ns.s + ns.s", start="[1]"),
    doubling("ns.s|replace('a', 'aa')"),
    doubling("ns.s.replace('a', 'aa')"),
    "{% set ns = namespace(s='a' * 60000, n=0) %}{% for i in range(100) %}{% set ns.n = (ns.s ~ i)|length %}"
    "{% endfor %}",
    "{{ 'a'.zfill(4000000) }}",
    "{{ 'a'|center(4000000) }}",
    "{{ 'a'|indent(4000000, true) }}",
    "{{ '%40000000s' % 'a' }}",
    "{{ '%-040000000d'|format(1) }}",
    "{{ '{:>40000000}'.format('a') }}",
    # issue 36: a width from the arguments; text of a nested value that shares itself (2^40 characters)
    "{{ '%*d' % (40000000, 1) }}",
    "{{ '%*d' % 40000000 }}",
    *(doubling("[ns.s, ns.s]", start="[1]").replace("{{ ns.s|length }}", out)
      for out in ("{{ ns.s }}", "{{ ns.s|tojson }}", "{{ ns.s ~ '' }}", "{{ ns.s|string }}", "{{ ns.s|join }}",
                  "{{ ns.s|pprint }}", "{{ ns.s + [] }}")),
    doubling("{'a': ns.s, 'b': ns.s}", start="{}").replace("{{ ns.s|length }}", "{{ ns.s|tojson }}"),
])
def test_growth_is_stopped_by_the_memory_budget(template):
    with pytest.raises(ValueError, match=r"from test: the chat template rejected these messages \(SecurityError"):
        chat_template.render(template, MESSAGES, time_limit_s=HOUR, origin="from test")


def test_ordinary_templates_still_render():
    source = ("{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>' + m['content'].strip()|trim ~ '\n' }}{% endfor %}"
              "{{ messages|tojson }}{{ 'x'|center(5) }}{{ '%3d|%s' % (7, 'a') }}{{ '{:>3}'.format('b') }}")
    assert chat_template.render(source, MESSAGES) == '<|user|>hi\n[{"role": "user", "content": "hi"}]  x    7|a  b'


def test_lipsum_is_not_offered():
    """`lipsum(n=10**7)` writes gigabytes; no chat template uses it."""
    with pytest.raises(ValueError, match="'lipsum' is undefined"):
        chat_template.render("{{ lipsum() }}", MESSAGES, time_limit_s=HOUR, origin="from test")


def test_a_format_width_is_refused_before_the_string_is_built():
    """Jinja hands templates its own wrapper of `str.format`: the width is checked when the method is looked up,
    not after a 1 GB string was made (the fuzzer's seed 2000247)."""
    with pytest.raises(ValueError, match="a format width too large"):
        chat_template.render("{{ '{:>1000000000}'.format('a') }}", MESSAGES, time_limit_s=HOUR, origin="from test")
