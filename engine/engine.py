"""The loaded target (and draft) model: loading, the drafter for a speculation mode, and sessions."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from ..models.progress import ProgressFn
from ..models.transformer import Transformer
from .cached_model import CachedModel
from .protocol import Capabilities
from .session import Session
from .speculative import Drafter, PromptLookup
from .threads import shared_tuner


def resolve_kv_cache(kind: str | None, device: torch.device, model: Transformer) -> str:
    """The KV cache storage: the flag, else PARLEY_KV_CACHE, else the measured default for the device.

    CPU (native step): int8 — see the README's KV cache table for the measurement behind it.
    CUDA: bf16, the model's own dtype there.
    """
    kind = kind or os.environ.get("PARLEY_KV_CACHE") or "auto"
    if kind == "auto":
        kind = "int8" if model.native is not None else "fp"
    return kind


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Engine:
    """Holds the target (a `CachedModel`: every reply starts from the longest prefix of its cache that
    the prompt shares) and the drafters, and runs one reply at a time."""

    def __init__(self, model: Transformer, tokenizer, *, name: str = "model", quantization: str = "none",
                 context_window: int | None = None, draft: Drafter | None = None, compile: bool = False,
                 kv_cache: str = "fp") -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_name = name
        self.quantization = quantization
        self.context_window = min(context_window or 8192, model.config.max_seq_len)
        self.kv_cache = kv_cache
        self.target = CachedModel(model, self.context_window, compile=compile, kv_cache=kv_cache)
        self.prompt_lookup = PromptLookup()
        self.target.tuner = shared_tuner()
        self.draft = draft

    @classmethod
    def load(cls, model_ref: str | None = None, *, quant: str = "awq", draft: str | None = None,
             progress: ProgressFn | None = None, device: str | None = None,
             context_window: int | None = None, group_size: int = 128, compile: bool | None = None,
             kv_cache: str | None = None, threads: int | None = None, chat_template: str | None = None) -> Engine:
        """Resolve, (quantize on first use,) and load a model; `draft` is a second model ref; `chat_template`
        a Jinja file used instead of the model's own template."""
        from ..models.loading import load_model
        from ..models.resolve import resolve
        from ..models.tokenizer import load_tokenizer

        dev = torch.device(device) if device else default_device()
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        files = resolve(model_ref, progress=progress)
        name = files.repo_id or Path(files.path).name
        tokenizer = load_tokenizer(files)
        if chat_template:
            from ..models.chat_template import read_template_file

            tokenizer.use_template(read_template_file(chat_template), chat_template)
        quantization = "none"
        if quant == "awq":
            from ..models.quantize.cache import ensure_quantized

            files = ensure_quantized(files, group_size=group_size, progress=progress)
            quantization = "awq-int4"
        elif quant != "none":
            raise ValueError(f"--quant {quant!r}: expected 'awq' or 'none'")
        model = load_model(files, dtype=dtype, device=dev)
        if quantization == "none" and model.config.quantization:
            quantization = f"{model.config.quantization.get('quant_method', 'quantized')}-int4"
        from .threads import configure_threads

        configure_threads(threads)
        if dev.type == "cpu":
            from ..models.native_step import attach

            # The native step: one call per pass, integer dot products, batch invariant (why: its docstring).
            attach(model, head_bits=8 if quantization != "none" else 32)
        if model.native is not None:
            pass
        elif quantization != "none":
            from ..models.quantize.head import FastHead

            model.lm_head = FastHead(model.lm_head.weight)
        elif dev.type == "cpu":
            from ..models.transposed_linear import transpose_linears

            transpose_linears(model)
        drafter: Drafter | None = None
        if draft:
            from .speculative import load_draft

            drafter = load_draft(draft, model, files, tokenizer, progress=progress, group_size=group_size)
        return cls(model, tokenizer, name=name, quantization=quantization,
                   context_window=context_window or int(os.environ.get("PARLEY_CONTEXT", 0)) or None,
                   draft=drafter, compile=compile if compile is not None else os.environ.get("PARLEY_COMPILE") == "1",
                   kv_cache=resolve_kv_cache(kv_cache, dev, model))

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

    def set_kv_cache(self, kind: str) -> None:
        """Switch the target's KV cache storage (`auto`: this device's default); the context is re-read once."""
        kind = resolve_kv_cache(kind, self.target.device, self.model)
        if kind != self.kv_cache:
            self.target.set_kv_cache(kind)
            self.kv_cache = kind

    def session(self, system_prompt: str | None = None) -> Session:
        return Session(self, system_prompt)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def drafter(self, mode: str) -> Drafter | None:
        """The drafter for a speculation mode; `auto` prefers a configured draft model."""
        if mode == "off":
            return None
        if mode == "draft" or (mode == "auto" and self.draft is not None):
            return self.draft
        return self.prompt_lookup

    def reset_cache(self) -> None:
        """Forget every cached token (the target's and the draft model's)."""
        self.target.rollback(0)
        if hasattr(self.draft, "reset"):
            self.draft.reset()

    # -- the target's verbs, for the benches ------------------------------------------------

    def forward(self, tokens: list[int], last_only: bool = False) -> Tensor:
        return self.target.forward(tokens, last_only)

    def commit(self, tokens: list[int]) -> None:
        self.target.commit(tokens)

    def prefill(self, ids: list[int]) -> int:
        return self.target.sync(ids)
