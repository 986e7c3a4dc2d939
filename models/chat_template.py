"""A model's own chat template, rendered as transformers renders it, in Jinja's sandbox.

Templates come from downloaded files, so they are untrusted code: they run in an
`ImmutableSandboxedEnvironment` (no attribute access to internals, no mutation of our objects) and
see only plain data. The globals and filters are the ones transformers provides, since templates
are written against those (`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII).

Rendering is also bounded: the source size, the output size, the time, and the memory, and a `cancel`
event stops it. Jinja has no hook per loop step, so every `for` loop's iterable is wrapped (at parse time)
in a generator that checks the budget; calls and attribute reads check it too. Memory: every operation that
can build a large string or list (`+`, `*`, `~`, calls, filters) is checked before it allocates (its size
arguments) and after (its result), and what they build is counted over the render: a template that doubles
a string in a loop stops at MAX_BUILT characters, not at the time limit.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import ModelLoadError

MAX_SOURCE = 1 << 20  # characters of template source (real ones are a few kB, tool-use ones ~50 kB)
MAX_OUTPUT = 1 << 24  # characters rendered: far beyond any context window
TIME_LIMIT_S = 10.0  # real templates render in milliseconds
MAX_BUILT = 4 * MAX_OUTPUT  # characters (or items) built by string/list operations over one render
MAX_SIZE_ARGUMENT = 1 << 24  # a width or count passed to a call or filter (`zfill`, `center`, `indent`)


class RenderCancelled(Exception):
    """The caller's cancel event was set while the template rendered (not the template's fault)."""


class _Budget(threading.local):
    """The limits of the render in progress on this thread (templates are compiled once, shared)."""

    deadline = float("inf")
    cancel: threading.Event | None = None
    built = 0

    def check(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise RenderCancelled("cancelled while rendering the chat template")
        if time.monotonic() > self.deadline:
            raise jinja2.exceptions.TemplateRuntimeError(
                f"rendering took longer than {TIME_LIMIT_S:g} s (a loop that does not end?)")


_budget = _Budget()


def _sized(value: Any) -> Any:
    """Count a string or list an operation built against the render's budget."""
    if isinstance(value, (str, list, tuple)):
        if len(value) > MAX_OUTPUT:
            raise jinja2.exceptions.SecurityError(f"a value of {len(value):,} items, more than a chat template "
                                                  "can output")
        _budget.built += len(value)
        if _budget.built > MAX_BUILT:
            raise jinja2.exceptions.SecurityError(f"the template built more than {MAX_BUILT:,} characters "
                                                  "(a loop that grows a string?)")
    return value


def _size_arguments(args: Iterable[Any]) -> None:
    """Refuse a size argument (`center(10**10)`, `zfill`, `indent(...)`) beyond what a template can output,
    and a nested value whose text would be (see `_flat_size`)."""
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_SIZE_ARGUMENT:
            raise jinja2.exceptions.SecurityError(f"an argument of {a} is too large for a chat template")
        _flat_size(a)


def _flat_size(value: Any) -> Any:
    """Refuse a list or dict whose text (`str`, `tojson`, `join`) would pass MAX_OUTPUT: a list that holds
    itself twice, doubled 40 times, is 40 small objects and a 2^40-character string. Sizes are summed over the
    distinct objects (a shared one is sized once), so the walk costs what the value holds, not its text."""
    if not isinstance(value, (list, tuple, dict)):
        return value
    sizes: dict[int, int] = {}
    busy: set[int] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, children_done = stack.pop()
        parts = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        if not children_done:
            if id(item) in sizes:
                continue
            if id(item) in busy:
                raise jinja2.exceptions.SecurityError("a value that contains itself")
            busy.add(id(item))
            stack.append((item, True))
            stack.extend((p, False) for p in parts if isinstance(p, (list, tuple, dict)))
            continue
        total = 2 + sum(sizes[id(p)] if isinstance(p, (list, tuple, dict)) else len(p) + 4 if isinstance(p, str)
                        else 8 for p in parts)
        if total > MAX_OUTPUT:
            raise jinja2.exceptions.SecurityError("a nested value whose text is larger than a chat template can "
                                                  "output")
        sizes[id(item)] = total
        busy.discard(id(item))
    return value


def _size_in_format(fmt: Any) -> None:
    """Refuse a format string with a width of 8 digits or more (`'%999999999s' % x`, `'{:>999999999}'.format`)."""
    if isinstance(fmt, str) and re.search(r"[%:][^a-zA-Z%}]*\d{8,}", fmt):
        raise jinja2.exceptions.SecurityError("a format width too large for a chat template")


def _joined(*parts: Any) -> str:
    """`a ~ b`: the sizes are checked before the join."""
    texts = [str(_flat_size(p)) for p in parts]
    if sum(map(len, texts)) > MAX_OUTPUT:
        raise jinja2.exceptions.SecurityError("a concatenation larger than a chat template can output")
    return _sized("".join(texts))


def _bounded_filter(f: Any) -> Any:
    @functools.wraps(f)  # keeps jinja's pass_context / pass_environment marks
    def checked(*args: Any, **kwargs: Any) -> Any:
        _budget.check()
        _size_arguments([*args[1:], *kwargs.values()])
        if args:
            _flat_size(args[0])
        if f.__name__ == "do_format":
            _size_in_format(args[0] if args else None)
        return _sized(f(*args, **kwargs))

    return checked


def _bounded(iterable: Iterable[Any]) -> Iterator[Any]:
    for item in iterable:
        _budget.check()
        yield item


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with every loop step, call and attribute read checking the render's budget."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in list(tree.find_all(nodes.For)):
            loop.iter = nodes.Call(nodes.Name("_parley_bounded", "load"), [loop.iter], [], None, None,
                                   lineno=loop.lineno)
        for concat in list(tree.find_all(nodes.Concat)):  # `a ~ b ~ c` -> _parley_joined(a, b, c)
            concat.nodes = [nodes.Call(nodes.Name("_parley_joined", "load"), concat.nodes, [], None, None,
                                       lineno=concat.lineno)]
        return tree

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's signature)
        _budget.check()
        _size_arguments([*args, *kwargs.values()])
        if getattr(__obj, "__name__", "") in ("format", "format_map"):
            _size_in_format(getattr(__obj, "__self__", None))
        return _sized(super().call(__context, __obj, *args, **kwargs))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget.check()
        if attribute in ("format", "format_map") and isinstance(obj, str):  # jinja returns its own wrapper,
            _size_in_format(obj)  # which `call` cannot see through: the width is checked here
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _budget.check()
        return super().getitem(obj, argument)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _budget.check()
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
            raise jinja2.exceptions.SecurityError(f"exponent {right} is too large for a chat template")
        if operator == "*" and isinstance(right, int) and isinstance(left, (str, list, tuple)) or \
                operator == "*" and isinstance(left, int) and isinstance(right, (str, list, tuple)):
            count, seq = (right, left) if isinstance(right, int) else (left, right)
            if count * len(seq) > MAX_OUTPUT:
                raise jinja2.exceptions.SecurityError("a repetition larger than a chat template can output")
        if operator == "%":
            _size_in_format(left)
            _size_arguments(right if isinstance(right, tuple) else [right])  # `'%*d' % (10**9, 1)`: the width
            if isinstance(left, str) and "*" in left and not isinstance(right, tuple):
                raise jinja2.exceptions.SecurityError("a `*` width without its arguments")
        _flat_size(left)
        _flat_size(right)
        if operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)) \
                and len(left) + len(right) > MAX_OUTPUT:
            raise jinja2.exceptions.SecurityError("a concatenation larger than a chat template can output")
        return _sized(super().call_binop(context, operator, left, right))

# For a model that ships no template (a base model) and whose family knows none (families.py): ChatML, the most
# common instruct format.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def read_template_file(path: str) -> str:
    """A `--chat-template` file's text, or a ModelLoadError naming it (it is compiled, sandboxed, on use)."""
    import stat
    from pathlib import Path

    try:
        fd = os.open(Path(path).expanduser(), os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device would block or never end
            os.close(fd)
            raise ModelLoadError(f"--chat-template {path}: not a regular file; pass a Jinja file")
        with open(fd, encoding="utf-8") as f:
            text = f.read(MAX_SOURCE + 1)  # longer is refused when compiled, without reading the rest
    except (OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"--chat-template {path}: cannot be read ({e}); pass a readable Jinja file") from None
    if not text.strip():
        raise ModelLoadError(f"--chat-template {path}: the file is empty; pass a Jinja chat template")
    return text


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    if len(source) > MAX_SOURCE:
        raise ModelLoadError(
            f"the model's chat template is {len(source)} characters, more than the {MAX_SOURCE} Parley accepts; "
            "fix chat_template in tokenizer_config.json (or the GGUF) or use another model"
        )
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols],
                         finalize=_flat_size)  # every `{{ value }}` is sized before it becomes text
    del env.globals["lipsum"]  # no chat template uses it; `lipsum(n=10**7)` is gigabytes of Latin
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["_parley_bounded"] = _bounded
    env.globals["_parley_joined"] = _joined
    env.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    try:
        return env.from_string(source)
    except (jinja2.TemplateSyntaxError, RecursionError, MemoryError) as e:
        raise ModelLoadError(
            f"the model's chat template does not parse ({type(e).__name__}: {e}); fix chat_template or use "
            "another model"
        ) from None


def pick_template(value: Any) -> str | None:
    """tokenizer_config's `chat_template` is a string, or a list of {name, template} of which "default" applies."""
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None


def render(source: str, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
           special_tokens: dict[str, str] | None = None, cancel: threading.Event | None = None,
           time_limit_s: float = TIME_LIMIT_S, origin: str = "the model's chat template") -> str:
    """The prompt text for `messages`. Messages are copied to plain dicts of plain values first.

    A ValueError naming `origin` (where the template came from) when the template fails or exceeds its
    bounds; RenderCancelled when `cancel` is set.
    """
    plain = [{str(k): v for k, v in dict(m).items()} for m in messages]
    template = compile_template(source)
    _budget.deadline, _budget.cancel, _budget.built = time.monotonic() + time_limit_s, cancel, 0
    parts, size = [], 0
    try:
        for chunk in template.generate(messages=plain, add_generation_prompt=add_generation_prompt,
                                       **(special_tokens or {})):
            _budget.check()
            size += len(chunk)
            if size > MAX_OUTPUT:
                raise jinja2.exceptions.TemplateRuntimeError(f"it rendered more than {MAX_OUTPUT} characters")
            parts.append(chunk)
    except RenderCancelled:
        raise
    except Exception as e:  # the template is foreign code: any failure in it is the template's
        raise ValueError(f"{origin}: the chat template rejected these messages ({type(e).__name__}: {e}); fix "
                         "the template or use another model") from None
    finally:
        _budget.deadline, _budget.cancel = float("inf"), None
    return "".join(parts)
