"""CUDA-graph replay of the decode / verification step: one graph launch instead of ~1,300 kernel launches.

Eager decode of a 7B model launches ~43 kernels per layer, so the CPU, not the GPU, sets the pace
(~100 tok/s whatever the model's size). A CUDA graph records the step once per static shape and replays
it with one launch. Shapes are made static by padding the pass length T up to a bucket (1, 2, 4, 8, 16 by
default: decode is T = 1, verification of k drafted tokens is T = k + 1); anything else that shapes the
step (an attention window, say) is passed as a keyword and becomes part of the graph's key.

Padding rows never disturb the real ones: pad row j (after the last real row at position p) takes
token 0 and position p + j while that slot exists (else p again, with p's token, so it writes what the
real row writes). A real row at position q only reads slots <= q, and the slots past p that pads write
are stale by the cache's own rule: the next real token at that position overwrites them before any
row reads them.

Requirements on `fn`: it reads only tensors whose storage never moves (weights, the KV cache, these
static inputs), does no host sync (no .item(), no Python branch on tensor values, no tensor built from
a Python list), and allocates nothing that must outlive the call. A first call per key runs `fn` eagerly
(which also triggers Triton compilation), captures, then replays; if capture fails, that key stays
eager and `fallbacks` records why.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable

import torch
from torch import Tensor

DEFAULT_BUCKETS = (1, 2, 4, 8, 16)


def graphs_enabled(device: torch.device | str) -> bool:
    """CUDA graphs are the default on CUDA; PARLEY_CUDA_GRAPHS=0 turns them off (eager everywhere)."""
    return torch.device(device).type == "cuda" and os.environ.get("PARLEY_CUDA_GRAPHS", "1") != "0"


def bucket_for(length: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket >= length, or None when the pass is longer than every bucket (eager)."""
    return next((b for b in buckets if b >= length), None)


def pad_inputs(tokens: Tensor, positions: Tensor, bucket: int, capacity: int,
               out_tokens: Tensor, out_positions: Tensor) -> None:
    """Copy tokens/positions [1, T] into the static [1, bucket] buffers, padded as the module says.

    Device-side only (no host sync): the pads' positions come from the last real position on the GPU.
    """
    T = tokens.shape[1]
    out_tokens[:, :T].copy_(tokens)
    out_positions[:, :T].copy_(positions)
    if bucket > T:
        last = positions[:, T - 1 : T]
        steps = torch.arange(1, bucket - T + 1, device=positions.device)[None]
        beyond = last + steps
        fits = beyond < capacity
        out_positions[:, T:].copy_(torch.where(fits, beyond, last))
        out_tokens[:, T:].copy_(torch.where(fits, torch.zeros_like(beyond), tokens[:, T - 1 : T]))


class _Graph:
    def __init__(self, graph: torch.cuda.CUDAGraph, tokens: Tensor, positions: Tensor, out: Tensor) -> None:
        self.graph, self.tokens, self.positions, self.out = graph, tokens, positions, out


class GraphedStep:
    """`fn(tokens [1, T], positions [1, T], **static) -> logits [1, T, V]`, replayed from CUDA graphs.

    capacity: the number of KV slots (pads never write at or past it). Calls with T above the largest
    bucket, on a non-CUDA device or with graphs disabled run `fn` eagerly. The returned logits are a
    fresh tensor (a copy of the graph's static output), safe to keep across calls.
    """

    def __init__(self, fn: Callable[..., Tensor], device: torch.device | str, capacity: int,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> None:
        self.fn, self.device, self.capacity, self.buckets = fn, torch.device(device), capacity, tuple(sorted(buckets))
        self.enabled = graphs_enabled(self.device)
        self.graphs: dict[tuple, _Graph] = {}
        self.fallbacks: dict[tuple, str] = {}  # key -> why it runs eagerly
        self.replays = 0
        self.pool = torch.cuda.graph_pool_handle() if self.enabled else None

    def reset(self) -> None:
        """Forget every graph: call after weights or cache buffers are reallocated."""
        self.graphs.clear()
        self.fallbacks.clear()

    def __call__(self, tokens: Tensor, positions: Tensor, **static: Hashable) -> Tensor:
        bucket = bucket_for(tokens.shape[1], self.buckets) if self.enabled else None
        key = (bucket, tuple(sorted(static.items())))
        if bucket is None or key in self.fallbacks:
            return self.fn(tokens, positions, **static)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self._capture(key, bucket, tokens, positions, static)
            if entry is None:
                return self.fn(tokens, positions, **static)
        pad_inputs(tokens, positions, bucket, self.capacity, entry.tokens, entry.positions)
        entry.graph.replay()
        self.replays += 1
        return entry.out[:, : tokens.shape[1]].clone()

    def _capture(self, key: tuple, bucket: int, tokens: Tensor, positions: Tensor, static: dict) -> _Graph | None:
        """Warm up on a side stream with this call's real (padded) inputs, so the KV it writes is the
        step's own, then record the graph. The caller replays it for the actual result."""
        static_tokens = torch.zeros(1, bucket, dtype=torch.long, device=self.device)
        static_positions = torch.zeros(1, bucket, dtype=torch.long, device=self.device)
        pad_inputs(tokens, positions, bucket, self.capacity, static_tokens, static_positions)
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self.fn(static_tokens, static_positions, **static)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.fn(static_tokens, static_positions, **static)
        except Exception as error:  # capture is an optimisation: any failure means eager for this key
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.fallbacks[key] = f"{type(error).__name__}: {error}"
            return None
        entry = _Graph(graph, static_tokens, static_positions, out)
        self.graphs[key] = entry
        return entry
