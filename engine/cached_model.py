"""A model with its KV cache and the token ids that cache holds: the state every reply builds on.

The target and the draft model are two instances. A reply calls `sync` (keep the longest common
prefix of what the cache holds, prefill the rest in chunks), then rounds of `forward` (write the KV of
a few tokens, return their logits) and `commit` (claim the KV of the tokens that were kept); anything
not committed is rolled back for free, since the next forward overwrites it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from typing import Protocol

import torch
from torch import Tensor

from ..models.transformer import KVCache, Span, Transformer
from .cuda_graphs import GraphedStep, graphs_enabled
from .prefix import common_prefix
from .threads import ThreadTuner

PREFILL_CHUNK = 512  # long pastes prefill in pieces so activation memory stays bounded
ROW_TILE = 16  # rows of a shared pass on the PyTorch path (`forward_batch`): every such pass has exactly this many
WINDOW_BUCKET = 256  # attention reads the cache up to the next multiple of this: few shapes, few slots


def shared_passes() -> bool:
    """Whether the PyTorch path shares passes between sequences (PARLEY_SHARED_PASSES=1). Off by default: on a
    CPU (the fallback when the native step cannot run) an fp32 product over 16 rows costs 2-3x one over a row, and
    on CUDA a shared pass runs eager, not as a graph; see docs/serving.md."""
    return os.environ.get("PARLEY_SHARED_PASSES", "0") == "1"


def attention_window(end: int, max_len: int) -> int:
    """Cache slots a pass over positions < `end` must read: `end` rounded up to a bucket."""
    return min(max_len, -(-end // WINDOW_BUCKET) * WINDOW_BUCKET)


class Step(Protocol):
    """One forward pass over a cache: the model itself, its compiled form, or the native CPU step.

    tokens, positions [1, T] -> logits [1, T (1 with `last_only`), V] fp32, writing the T positions' K/V;
    attention reads the first `window` slots (a step may read exactly up to each position instead).
    """

    def __call__(self, tokens: Tensor, positions: Tensor, cache: KVCache, last_only: bool = False,
                 window: int | None = None) -> Tensor: ...


class CachedModel:
    """Owns a model's KV cache; `ids` are exactly the tokens whose keys/values it holds, in order.

    It chooses the step a pass runs (`step_kind`): `native` (the CPU step `prepare_for_device` built,
    for every pass), else `tiled` (PARLEY_SHARED_PASSES=1: every pass as `forward_spans` in ROW_TILE-row tiles,
    shared between slots), `graphed` (CUDA graphs for decode and verification), `compiled` (torch.compile of the
    decode step) or `torch` (the model's own forward).
    """

    def __init__(self, model: Transformer, max_len: int, *, compile: bool = False, kv_cache: str = "fp",
                 native: Step | None = None) -> None:
        self.model = model.eval()
        self.native = native
        self.bulk: Step = native or model  # prefill: compute-bound and once per turn, never compiled
        # The decode/verify step (a few tokens) is where per-op Python overhead shows: compile it once,
        # with dynamic shapes so any draft length and window reuse the same graph.
        # (The native CPU step is one call already: nothing to compile.)
        if native is not None:
            self.step: Step = native
        else:
            self.step = torch.compile(model, dynamic=True, fullgraph=True) if compile else model
        self.device = model.norm.weight.device
        self.cache = model.new_cache(max_len, kind=kv_cache)
        self.tuner: ThreadTuner | None = None  # set on the target: decode steps adapt the thread count
        # On CUDA, decode and verification passes (T <= 16) replay CUDA graphs: one launch per step
        # instead of ~1,300; a shape whose capture fails stays eager (`graphed.fallbacks` says why).
        graphed = native is None and graphs_enabled(self.device)
        self.graphed = GraphedStep(self._graph_step, self.device, max_len) if graphed else None
        # every pass runs in ROW_TILE-row tiles, alone or shared (0: not)
        self.row_tile = ROW_TILE if native is None and shared_passes() else 0
        self.ids: list[int] = []
        self._fed: list[int] = []  # the last forward's tokens, whose KV sits uncommitted after `ids`
        self._tree: list[int] = []  # the last tree pass's parents
        self.drafters: dict[int, tuple[object, object]] = {}  # session.own_drafter: drafters indexing these ids

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    @property
    def step_kind(self) -> str:
        """native | tiled | graphed | compiled | torch: what decode and verification passes run on."""
        if self.native is not None:
            return "native"
        if self.row_tile:
            return "tiled"
        if self.graphed is not None:
            return "graphed"
        return "compiled" if self.step is not self.model else "torch"

    def forward(self, tokens: list[int], last_only: bool = False) -> Tensor:
        """Logits [T, V] (the last row only with `last_only`) for `tokens` placed right after `ids`;
        their KV is written but not claimed until `commit`."""
        return forward_batch([(self, tokens, None, len(tokens) - 1 if last_only else 0)])[0]

    @property
    def trees(self) -> bool:
        """Whether `forward_tree` runs here (the native step; elsewhere drafters propose chains)."""
        return self.native is not None and hasattr(self.native, "tree")

    def forward_tree(self, tokens: list[int], parents: list[int]) -> Tensor:
        """Logits [N, V] for a tree of tokens after `ids` (tokens[0] the root, parents[m] < m the node that
        tokens[m] follows); node m's KV is written at slot len(ids) + m until `commit_path` moves the kept
        path's into place. Each row equals, bitwise, the linear pass over the path to its node."""
        assert self.native is not None
        return forward_batch([(self, tokens, parents, 0)])[0]

    def _single(self, tokens: list[int], wanted: int) -> Tensor:
        """One pass of this model alone (the PyTorch path, and a native step without `batch`): the logits of
        rows `wanted` on."""
        start = len(self.ids)
        end = start + len(tokens)
        # a prefill chunk wants its last row at most; a 1-token pass wanting its row is a decode step (graphed,
        # tuned), not a chunk
        last_only = wanted >= max(1, len(tokens) - 1)
        ids = torch.tensor([tokens], device=self.device)
        pos = torch.arange(start, end, device=self.device)[None]
        model = self.bulk if last_only else self.step
        window = attention_window(end, self.max_len)
        if self.graphed is not None and not last_only:
            logits = self.graphed(ids, pos, window=window)[0]
        elif last_only or len(tokens) > 32 or self.tuner is None:
            if self.tuner is not None:
                self.tuner.bulk()
            logits = model(ids, pos, self.cache, last_only, window)[0]
        else:  # decode and verification: time the step, so the thread count follows a busy machine
            n = self.tuner.before_step()
            t = time.perf_counter()
            logits = model(ids, pos, self.cache, last_only, window)[0]
            self.tuner.after_step(n, time.perf_counter() - t, len(tokens))
        if last_only:
            return logits[len(logits) - (len(tokens) - wanted):]
        return logits[wanted:]

    def commit_path(self, nodes: list[int]) -> None:
        """Claim the KV of a path of the last tree (nodes[0] = 0, each the next one's parent): its slots are
        moved to the positions the path's tokens now hold, then committed."""
        parents, fed = self._tree, self._fed
        if nodes and (nodes[0] != 0 or any(parents[b] != a for a, b in zip(nodes, nodes[1:], strict=False))):
            raise ValueError(f"cannot commit nodes {nodes}: not a path from the root of the last tree")
        start = len(self.ids)
        moved = [(start + m, start + d) for d, m in enumerate(nodes) if m != d]
        if moved:
            assert self.native is not None
            self.native.move_slots(self.cache, [s for s, _ in moved], [d for _, d in moved])
        self._fed = [fed[m] for m in nodes]
        self._tree = []
        self.commit(len(nodes))

    def _graph_step(self, ids: Tensor, pos: Tensor, *, window: int) -> Tensor:
        return self.step(ids, pos, self.cache, False, window)

    def set_kv_cache(self, kind: str) -> None:
        """Store the cache as `kind` from now on (a new, empty cache: the next sync re-reads the context)."""
        self.cache = self.model.new_cache(self.max_len, kind=kind)
        self.ids, self._fed = [], []
        if self.graphed is not None:
            self.graphed.reset()  # the graphs point at the old cache's buffers

    def commit(self, n: int | list[int]) -> None:
        """Claim the KV of the first `n` tokens of the last forward (or of those tokens, given as a list)."""
        tokens = self._fed[:n] if isinstance(n, int) else n
        if (isinstance(n, int) and not 0 <= n <= len(self._fed)) or tokens != self._fed[: len(tokens)]:
            raise ValueError(f"cannot commit {n}: not a prefix of the last forward's {len(self._fed)} tokens")
        self.ids.extend(tokens)
        self._fed = []
        self.cache.truncate(len(self.ids))

    def rollback(self, length: int) -> None:
        """Keep the first `length` tokens' KV."""
        del self.ids[length:]
        self._fed = []
        self.cache.truncate(len(self.ids))

    def copy_prefix(self, donor: CachedModel, n: int) -> None:
        """Hold the first `n` tokens of `donor` (another slot of the same model), taking the KV of those past the
        prefix the two share from its cache instead of computing them: what a pass would have written, bitwise,
        where passes are batch invariant (the native step: a position's K/V depend on the tokens up to it only)."""
        have = common_prefix(self.ids, donor.ids[:n])
        self.cache.copy_positions(donor.cache, have, n)
        self.ids = list(donor.ids[:n])
        self._fed = []
        self.cache.truncate(n)

    def sync(self, ids: list[int]) -> int:
        """Make the cache hold exactly `ids`, reusing the longest common prefix; return how many
        tokens were reused."""
        steps = self.sync_steps(ids)
        while True:
            try:
                next(steps)
            except StopIteration as end:
                return end.value

    def sync_steps(self, ids: list[int]) -> Generator[int, None, int]:
        """`sync`, yielding the tokens cached so far before each chunk: a caller can report progress, or stop
        between chunks (the cache then holds a prefix of `ids`, consistent). Returns the tokens reused."""
        reused = common_prefix(self.ids, ids)
        self.rollback(reused)
        for i in range(reused, len(ids), PREFILL_CHUNK):
            yield i
            chunk = ids[i : i + PREFILL_CHUNK]
            forward_batch([(self, chunk, None, len(chunk))])  # no logits: only the chunk's KV is wanted
            self.commit(len(chunk))
        return reused


def tree_depths(parents: list[int]) -> list[int]:
    """Each node's depth in a tree given by its parents (parents[0] = -1, parents[m] < m)."""
    depth = [0] * len(parents)
    for m in range(1, len(parents)):
        depth[m] = depth[parents[m]] + 1
    return depth


Part = tuple[CachedModel, list[int], "list[int] | None", int]  # model, tokens, tree parents or None, first row wanted


@torch.inference_mode()
def forward_batch(parts: list[Part]) -> list[Tensor]:
    """One pass over several sequences, each (model, tokens, parents, wanted): its tokens go right after what its
    cache holds (a chain, or a tree by `parents` as in `forward_tree`), their KV written but not claimed until
    `commit` (or `commit_path`); returns per part the logits of its rows from `wanted` on (a prefill chunk wants
    none: `wanted` = len(tokens)).

    On the native step every part shares one call (the products read the weights once for all rows; each row
    attends its own cache), and each part's logits are bitwise those of its pass alone. On the PyTorch path, with
    `row_tile` (PARLEY_SHARED_PASSES=1), every row runs in a pass of exactly ROW_TILE rows (`_torch_passes`), so
    each part's logits and K/V are again those of its pass alone; otherwise each part runs as it does alone."""
    for model, tokens, parents, wanted in parts:
        end = len(model.ids) + len(tokens)
        if end > model.max_len:
            raise ValueError(f"{end} positions exceed the context window of {model.max_len}")
        if not tokens or not 0 <= wanted <= len(tokens):
            raise ValueError(f"a pass of {len(tokens)} tokens cannot return logits from row {wanted}")
        if parents is not None and (len(parents) != len(tokens) or model.native is None):
            raise ValueError("a tree pass needs the native step and one parent per token")
    native = parts[0][0].native
    if native is not None and hasattr(native, "batch") and all(p[0].native is native for p in parts):
        out = _native_pass(native, parts)
    else:
        out = _torch_passes(parts)
    for model, tokens, parents, _ in parts:
        model._fed, model._tree = list(tokens), list(parents or [])
    return out


def _torch_passes(parts: list[Part]) -> list[Tensor]:
    """The PyTorch path. Parts of a model with `row_tile` run in passes of exactly ROW_TILE rows, prefill chunks and
    a first round's prompt rows too: a part is cut into pieces of ROW_TILE rows, run in order (each attends the K/V
    the pieces before it wrote), and the pieces of several parts share a tile. Its products are batch invariant
    across the rows of one row count, not across counts, so a row's K/V and logits are then the same however the
    scheduler cut the prompt, however many guesses rode with it and whatever shared its tile; a pass of the length
    the row happened to be in would change their last bits, and a sampled reply's draws with them. Other parts run
    alone, as they do alone."""
    out: list[Tensor | None] = [None] * len(parts)
    pieces: dict[int, list[Tensor]] = {}
    tile: list[tuple[int, int, int]] = []  # (part, first row, end row)

    def flush() -> None:
        for (i, _, _), logits in zip(tile, _tiled_pass([(parts[i], a, b) for i, a, b in tile]), strict=True):
            pieces[i].append(logits)
        tile.clear()

    for i, (model, tokens, _, wanted) in enumerate(parts):
        if not model.row_tile:
            out[i] = model._single(tokens, wanted)
            continue
        pieces[i] = []
        for a in range(0, len(tokens), ROW_TILE):
            b = min(a + ROW_TILE, len(tokens))
            if tile and (sum(e - s for _, s, e in tile) + b - a > ROW_TILE
                         or parts[tile[0][0]][0].model is not model.model):
                flush()
            tile.append((i, a, b))
    if tile:
        flush()
    for i, logits in pieces.items():
        out[i] = torch.cat(logits)
    return out  # type: ignore[return-value]


def _tiled_pass(pieces: list[tuple[Part, int, int]]) -> list[Tensor]:
    """One ROW_TILE-row pass (Transformer.forward_spans) over rows a:b of each part: their logits from the part's
    `wanted` on. The head runs only where some row's logits are wanted."""
    model = pieces[0][0][0]
    spans, tokens, at, keep = [], [], 0, []
    for (m, toks, _, wanted), a, b in pieces:
        start = len(m.ids) + a
        spans.append(Span(slice(at, at + b - a), torch.arange(start, start + b - a, device=m.device), m.cache))
        tokens.extend(toks[a:b])
        keep.append(min(max(wanted - a, 0), b - a))
        at += b - a
    if model.tuner is not None:
        model.tuner.bulk()  # one thread count for every tile: a product's arithmetic may follow it
    head = any(k < len(s.positions) for k, s in zip(keep, spans, strict=True))
    logits = model.model.forward_spans(torch.tensor(tokens, device=model.device), spans, ROW_TILE, head=head)
    return [logits[s.rows][k:] for s, k in zip(spans, keep, strict=True)]


def _native_pass(native, parts: list[Part]) -> list[Tensor]:
    rows = sum(len(p[1]) for p in parts)
    args = []
    for model, tokens, parents, wanted in parts:
        start = len(model.ids)
        positions = [start + d for d in tree_depths(parents)] if parents else list(range(start, start + len(tokens)))
        args.append((model.cache, tokens, positions, parents, wanted))
    tuner = parts[0][0].tuner
    decoding = rows <= 32 and any(w < len(t) for _, t, _, w in parts)
    if tuner is None or not decoding:
        if tuner is not None:
            tuner.bulk()
        return native.batch(args)
    n = tuner.before_step()  # decode and verification: time the step, so the thread count follows a busy machine
    t = time.perf_counter()
    out = native.batch(args)
    tuner.after_step(n, time.perf_counter() - t, rows)
    return out
