"""A chat template cannot make Parley allocate without bound: growth stops at a character budget, at once.

A probe of issue 25 rendered a template that doubles a string in a loop: 3.58 GB of memory before the 10 s
time limit. Each template below would allocate gigabytes (or more) if unchecked; each must fail with the
template named, quickly and before its allocation (the time limit is set to an hour, so only the memory
bounds can stop them)."""

from __future__ import annotations

import pytest

from parley.models import chat_template

MESSAGES = [{"role": "user", "content": "hi"}]
HOUR = 3600.0


@pytest.mark.parametrize("template", [
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s|replace('a', 'aa') %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s.replace('a', 'aa') %}{% endfor %}",
    "{% set ns = namespace(s='a' * 1000000, n=0) %}{% for i in range(100000) %}{% set ns.n = (ns.s ~ i)|length %}"
    "{% endfor %}",
    "{{ 'a'.zfill(10000000000) }}",
    "{{ 'a'|center(10000000000) }}",
    "{{ ('a' * 10000000)|indent(1000000000) }}",
])
def test_growth_is_stopped_by_the_memory_budget(template):
    with pytest.raises(ValueError, match=r"from test: the chat template rejected these messages \(SecurityError"):
        chat_template.render(template, MESSAGES, time_limit_s=HOUR, origin="from test")


def test_ordinary_templates_still_render():
    source = ("{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>' + m['content'].strip()|trim ~ '\n' }}{% endfor %}"
              "{{ messages|tojson }}{{ 'x'|center(5) }}")
    assert chat_template.render(source, MESSAGES) == '<|user|>hi\n[{"role": "user", "content": "hi"}]  x  '
