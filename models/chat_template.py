"""A model's own chat template, rendered as transformers renders it, in Jinja's sandbox.

Templates come from downloaded files, so they are untrusted code: they run in an
`ImmutableSandboxedEnvironment` (no attribute access to internals, no mutation of our objects) and
see only plain data. The globals and filters are the ones transformers provides, since templates
are written against those (`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII).

Rendering is also bounded: the source size, the output size, the time, and string/list repetition are
capped, and a `cancel` event stops it. Jinja has no hook per loop step, so every `for` loop's iterable is
wrapped (at parse time) in a generator that checks the budget; calls and attribute reads check it too.
"""

from __future__ import annotations

import json
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


class RenderCancelled(Exception):
    """The caller's cancel event was set while the template rendered (not the template's fault)."""


class _Budget(threading.local):
    """The limits of the render in progress on this thread (templates are compiled once, shared)."""

    deadline = float("inf")
    cancel: threading.Event | None = None

    def check(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise RenderCancelled("cancelled while rendering the chat template")
        if time.monotonic() > self.deadline:
            raise jinja2.exceptions.TemplateRuntimeError(
                f"rendering took longer than {TIME_LIMIT_S:g} s (a loop that does not end?)")


_budget = _Budget()


def _bounded(iterable: Iterable[Any]) -> Iterator[Any]:
    for item in iterable:
        _budget.check()
        yield item


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with every loop step, call and attribute read checking the render's budget."""

    intercepted_binops = frozenset({"*", "**", "+"})

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in list(tree.find_all(nodes.For)):
            loop.iter = nodes.Call(nodes.Name("_parley_bounded", "load"), [loop.iter], [], None, None,
                                   lineno=loop.lineno)
        return tree

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's signature)
        _budget.check()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget.check()
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
        return super().call_binop(context, operator, left, right)

# For a model that ships no template (a base model): ChatML, the most common instruct format.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A family's known template, for its files that ship none (base models), as llama.cpp keeps them.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{% if role == 'system' %}{{ '<start_of_turn>user\n' + message['content'] + '\n\n' }}"
    "{% else %}{% if not (loop.index0 == 1 and messages[0]['role'] == 'system') %}"
    "{{ '<start_of_turn>' + role + '\n' }}{% endif %}{{ message['content'] | trim + '<end_of_turn>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
FAMILY_TEMPLATES = {"gemma": GEMMA_TEMPLATE, "gemma2": GEMMA_TEMPLATE, "gemma3": GEMMA_TEMPLATE}


def read_template_file(path: str) -> str:
    """A `--chat-template` file's text, or a ModelLoadError naming it (it is compiled, sandboxed, on use)."""
    from pathlib import Path

    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
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
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["_parley_bounded"] = _bounded
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
    _budget.deadline, _budget.cancel = time.monotonic() + time_limit_s, cancel
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
