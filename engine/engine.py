"""The loaded target (and draft) model: loading, the drafter for a speculation mode, and sessions."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor

from ..models.progress import ProgressFn
from ..models.transformer import KV_CACHE_TYPES, Transformer
from .cached_model import CachedModel, Step
from .kv_pool import KVPool, default_slots, parse_slots
from .protocol import Capabilities
from .scheduler import Scheduler
from .session import Session
from .speculation_pay import pass_cost_from_env
from .speculative import Drafter, PromptLookup, SuffixMatch
from .threads import shared_tuner, start_window


def resolve_kv_cache(kind: str | None, native: bool) -> str:
    """A KV cache choice as a storage type: `auto` (or None) is PARLEY_KV_CACHE, else this device's
    measured default: int8 on the native CPU step (docs/kv-cache.md has the measurement behind
    it), else the model's own dtype (bf16 on CUDA)."""
    if kind in (None, "auto"):
        kind = os.environ.get("PARLEY_KV_CACHE") or "auto"
        where = "PARLEY_KV_CACHE"
    else:
        where = "--kv-cache"
    if kind == "auto":
        return "int8" if native else "fp"
    if kind not in KV_CACHE_TYPES:
        raise ValueError(f"{where}={kind!r}: expected auto or one of {', '.join(KV_CACHE_TYPES)}")
    return kind


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Engine:
    """Holds the target model, its pool of KV slots (`KVPool`: a slot per running reply, each reply starting from
    the longest prefix its prompt shares with a free slot) and the scheduler that runs every running reply's next
    tokens in one pass (`Scheduler`), and the drafters.

    Engine-level choices (the KV cache type) are made here, when no reply runs; the live GenerationParams a
    reply reads carry sampling only.
    """

    # The model makers' sampling values and where they come from (models/sampling_defaults.py), for the app.
    sampling_defaults: tuple[dict[str, float | int], str] = ({}, "")

    def __init__(self, model: Transformer, tokenizer, *, name: str = "model", quantization: str = "none",
                 context_window: int | None = None, draft: Drafter | None = None, compile: bool = False,
                 kv_cache: str | None = None, native: Step | None = None, parallel: int | None = None) -> None:
        """`model` as `prepare_for_device` left it, with the native step it returned (if any). `parallel`: how many
        replies run at once (KV slots of a whole window each); None: PARLEY_PARALLEL, else what a quarter of
        the available memory holds, 1 to 8."""
        self.model = model.eval()
        self.native = native
        self.tokenizer = tokenizer
        self.model_name = name
        self.quantization = quantization
        self.context_window = min(context_window or 8192, model.config.max_seq_len)
        self.kv_cache = resolve_kv_cache(kv_cache, native is not None)
        self._kv_wanted = self.kv_cache  # set_kv_cache's choice, applied when no reply runs
        self._compile = compile
        self.tuner = shared_tuner()
        slot_bytes = model.new_cache(1, kind=self.kv_cache).bytes_per_position() * self.context_window
        self.pool = KVPool(self._new_slot, parse_slots(parallel) if parallel is not None else default_slots(slot_bytes))
        self.scheduler = Scheduler(self.pool, lambda: self.pass_cost)
        self.prompt_lookup = PromptLookup()
        self.suffix_match = SuffixMatch()
        # several candidates per pass where the target runs tree passes: up to 3 per node, 2 nodes per token of
        # depth, down to a running probability of 0.1 (the pass-cost model then keeps those that pay)
        self.suffix_tree = SuffixMatch(width=3, nodes=2.0, min_score=0.1)
        self.pass_cost = pass_cost_from_env()  # what a pass costs by its rows, measured as replies run
        self.draft = draft

    def _new_slot(self) -> CachedModel:
        slot = CachedModel(self.model, self.context_window, compile=self._compile, kv_cache=self.kv_cache,
                           native=self.native)
        slot.tuner = self.tuner
        return slot

    @property
    def target(self) -> CachedModel:
        """The slot of the latest reply (the first slot before any): what the benches' verbs act on."""
        return self.pool.first()

    @property
    def parallel(self) -> int:
        """How many replies run at once (the KV pool's slots)."""
        return self.pool.size
    @classmethod
    def load(cls, model_ref: str | None = None, *, quant: str = "awq", draft: str | None = None,
             progress: ProgressFn | None = None, device: str | None = None,
             context_window: int | None = None, group_size: int = 128, compile: bool | None = None,
             kv_cache: str | None = None, threads: int | None = None, native: bool = True,
             chat_template: str | None = None, parallel: int | None = None) -> Engine:
        """Resolve, (quantize on first use,) and load a model; `draft` is a second model ref; `chat_template`
        a Jinja file used instead of the model's own template.
        `native=False` keeps the PyTorch path on the CPU (what `bench decode --path torch` measures)."""
        from ..models.loading import load_model
        from ..models.resolve import resolve
        from ..models.tokenizer import load_tokenizer

        start_window()  # the first passes' thread count is judged by what others run while this loads
        dev = torch.device(device) if device else default_device()
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        files = source = resolve(model_ref, progress=progress)
        name = files.repo_id or Path(files.path).name
        tokenizer = load_tokenizer(files)
        if chat_template:
            from ..models.chat_template import read_template_file

            tokenizer.use_template(read_template_file(chat_template), chat_template)
        quantization = "none"
        imported = None
        if quant == "awq":
            from ..models.quantize.cache import ensure_quantized

            files = ensure_quantized(files, group_size=group_size, progress=progress)
            quantization = "awq-int4"
        elif quant == "gguf":  # the file's own 4-bit blocks on the INT4 kernels: nothing to quantize
            from ..models.gguf_int4 import Imported

            imported = Imported()
        elif quant != "none":
            raise ValueError(f"--quant {quant!r}: expected 'awq', 'gguf' or 'none'")
        else:
            from ..models.loading import load_config
            from ..models.weights_dtype import weights_dtype

            config = load_config(files)
            if not config.quantization:  # an AWQ folder's linears are INT4 whatever dtype its other tensors get
                dtype = weights_dtype(config, dev, str(files.path), files)
        from ..models import native_cache
        from ..models.device_prep import prepare_for_device
        from ..models.quantize.head4 import head_calibration
        from .threads import configure_threads

        with ThreadPoolExecutor(1) as side:
            # Where the native layout is cached: for a GGUF that hashes the file (seconds at 8B), on a second
            # thread while the model loads (hashlib lets go of the GIL).
            cpu_step = native and dev.type == "cpu"
            place = side.submit(native_cache.place_of, files, imported is not None) if cpu_step else None
            model = load_model(files, dtype=dtype, device=dev, progress=progress, name=name, gguf_int4=imported,
                               int4_on_use=native)  # the native step runs its own copy (`Int4Linear.read_on_use`)
            configure_threads(threads)
            # On the CPU the native step: one call per pass, integer dot products, batch invariant.
            step = prepare_for_device(model, native=native, progress=progress,
                                      place=place.result() if place is not None else None,
                                      calibration=lambda: head_calibration(tokenizer))
        if imported is not None:
            quantization = f"gguf-int4:{imported.words()}"
        if quantization == "none" and model.config.quantization:
            quantization = f"{model.config.quantization.get('quant_method', 'quantized')}-int4"
        drafter: Drafter | None = None
        if draft:
            from .speculative import load_draft

            drafter = load_draft(draft, model, files, tokenizer, progress=progress, group_size=group_size,
                                 native=step is not None, target_step=step)
        engine = cls(model, tokenizer, name=name, quantization=quantization,
                     context_window=context_window or int(os.environ.get("PARLEY_CONTEXT", 0)) or None,
                     draft=drafter, compile=compile if compile is not None else os.environ.get("PARLEY_COMPILE") == "1",
                     kv_cache=kv_cache, native=step, parallel=parallel)
        from ..models.sampling_defaults import sampling_defaults

        engine.sampling_defaults = sampling_defaults(source, name)
        return engine

    def fresh(self, *, context_window: int | None = None, draft: Drafter | None = None,
              parallel: int | None = None) -> Engine:
        """An engine over the same weights (and native step) with a pool of its own, empty."""
        engine = Engine(self.model, self.tokenizer, name=self.model_name, quantization=self.quantization,
                        context_window=context_window or self.context_window, draft=draft, kv_cache=self.kv_cache,
                        native=self.native, parallel=parallel or self.parallel)
        engine.sampling_defaults = self.sampling_defaults
        return engine

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

    @property
    def step_kind(self) -> str:
        """What the target's decode passes run on: native | graphed | compiled | torch."""
        return self.target.step_kind

    def set_kv_cache(self, kind: str | None) -> None:
        """Store the KV caches as `kind` (`auto`: PARLEY_KV_CACHE, else this device's default) from the next
        reply on; the context is re-read once. The one place the cache type is set: the flag and the variable
        (at load) and the panel all come here. Safe mid-reply: applied once no reply runs (replies that arrive
        meanwhile wait for that moment)."""
        self._kv_wanted = resolve_kv_cache(kind, self.native is not None)
        self.scheduler.when_idle(self._apply_choices)

    def _apply_choices(self) -> None:
        if self._kv_wanted != self.kv_cache:
            self.kv_cache = self._kv_wanted
            for slot in self.pool.slots:
                slot.set_kv_cache(self.kv_cache)

    def session(self, system_prompt: str | None = None, raw: bool = False) -> Session:
        """A conversation; `raw`: one that continues text as written (no chat template)."""
        return Session(self, system_prompt, raw=raw)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def drafter(self, mode: str) -> Drafter | None:
        """The drafter for a speculation mode; `auto` prefers a configured draft model, else suffix match."""
        if mode == "off":
            return None
        if mode == "draft" or (mode == "auto" and self.draft is not None):
            return self.draft
        if mode == "suffix-tree" and self.target.trees:
            return self.suffix_tree
        return self.prompt_lookup if mode == "prompt-lookup" else self.suffix_match

    def reset_cache(self) -> None:
        """Forget every cached token (every slot's, its drafters' indexes and the draft model's); between replies.
        A drafter's index rolled back rather than rebuilt may draft otherwise (`SuffixTrie.truncate`), so a bench
        that starts each reply here sees every mode start alike."""
        for slot in self.pool.slots:
            slot.rollback(0)
            slot.drafters.clear()
        if hasattr(self.draft, "reset"):
            self.draft.reset()

    # -- the target's verbs, for the benches ------------------------------------------------

    def forward(self, tokens: list[int], last_only: bool = False) -> Tensor:
        return self.target.forward(tokens, last_only)

    def commit(self, tokens: list[int]) -> None:
        self.target.commit(tokens)

    def prefill(self, ids: list[int]) -> int:
        return self.target.sync(ids)
