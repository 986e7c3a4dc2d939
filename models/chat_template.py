"""A model's own chat template, rendered as transformers renders it, in Jinja's sandbox.

Templates come from downloaded files, so they are untrusted code: they run in an
`ImmutableSandboxedEnvironment` (no attribute access to internals, no mutation of our objects) and
see only plain data. The globals and filters are the ones transformers provides, since templates
are written against those (`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import ModelLoadError

# For a model that ships no template (a base model): ChatML, the most common instruct format.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ModelLoadError(
            f"the model's chat template does not parse ({e}); fix chat_template or use another model"
        ) from None


def pick_template(value: Any) -> str | None:
    """tokenizer_config's `chat_template` is a string, or a list of {name, template} of which "default" applies."""
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None


def render(source: str, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
           special_tokens: dict[str, str] | None = None) -> str:
    """The prompt text for `messages`. Messages are copied to plain dicts of plain values first."""
    plain = [{str(k): v for k, v in dict(m).items()} for m in messages]
    try:
        return compile_template(source).render(
            messages=plain, add_generation_prompt=add_generation_prompt, **(special_tokens or {})
        )
    except Exception as e:  # the template is foreign code: any failure in it is the template's
        raise ValueError(f"the model's chat template rejected these messages: {type(e).__name__}: {e}") from None
