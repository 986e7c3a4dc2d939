"""Modules that hold no weights until something uses them, then read them from the checkpoint.

Why: on the CPU the native step runs a packed copy of its own of every decoder linear and of the output head,
read from its layout cache at a cached start, so the modules' copies would be dead weight (3.8 GB of INT4 and a
2.1 GB fp32 head at 8B), as would a GGUF's embedding table decoded to fp32 (another 2.1 GB) when each pass needs
only its own tokens' rows. The loader (models/loading.py) leaves such tensors on the meta device and gives the
module a reader of the checkpoint: whatever does use them (a first start's packing, the PyTorch path, a
self-draft's packing) reads them then, and `release` lets them go again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn


class ReadOnUse:
    """Mixed into an nn.Module: the tensors named in `ON_USE` (buffers or parameters) may be meta until used."""

    ON_USE: tuple[str, ...] = ()

    def read_on_use(self, read: Callable[[], dict[str, Tensor]]) -> None:
        """From now on the `ON_USE` tensors held on the meta device are read by `read()` (all at once, by name)
        when first asked for."""
        self.__dict__["_read"] = read

    def release(self) -> None:
        """Drop the `ON_USE` tensors of a module that can read them again (`read_on_use`); else keep them."""
        if self.__dict__.get("_read") is None:
            return
        for store, name in self._on_use_slots():
            t = store[name]
            if not t.is_meta:
                meta = torch.empty(t.shape, dtype=t.dtype, device="meta")
                store[name] = nn.Parameter(meta, requires_grad=False) if isinstance(t, nn.Parameter) else meta
        self._released()

    def _released(self) -> None:
        """What a subclass drops with its tensors (a repacked form of them)."""

    def _on_use_slots(self) -> list[tuple[dict[str, Any], str]]:
        slots = []
        for name in self.ON_USE:
            for store in (self._buffers, self._parameters):  # type: ignore[attr-defined]
                if store.get(name) is not None:
                    slots.append((store, name))
        return slots

    def __getattr__(self, name: str) -> Any:
        value = super().__getattr__(name)  # type: ignore[misc]
        if name in self.ON_USE and isinstance(value, Tensor) and value.is_meta and self.__dict__.get("_read"):
            self._materialize()
            value = super().__getattr__(name)  # type: ignore[misc]
        return value

    def _materialize(self) -> None:
        tensors = self.__dict__["_read"]()
        for store, name in self._on_use_slots():
            held, t = store[name], tensors.get(name)
            if t is None or t.shape != held.shape or t.dtype != held.dtype:
                raise ValueError(f"{name}: read {None if t is None else (tuple(t.shape), t.dtype)}, the module "
                                 f"holds {(tuple(held.shape), held.dtype)}")
            store[name] = nn.Parameter(t, requires_grad=False) if isinstance(held, nn.Parameter) else t


class RowBlocks:
    """A [rows, cols] weight not held, read from the checkpoint a row block at a time (`blocks[r0:r1]`): for a
    packer that walks its rows in blocks anyway (`kernels.native.pack_q8`), so that the whole fp32 weight (2.1
    GB for an 8B head) is never held at once."""

    def __init__(self, shape: torch.Size, read: Callable[[int, int], Tensor]) -> None:
        self.shape, self._read = shape, read

    def __getitem__(self, rows: slice) -> Tensor:
        start, stop, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("RowBlocks reads contiguous row ranges")
        return self._read(start, stop)


class WeightOnUse(ReadOnUse):
    """Mixed into a module whose `weight` is read on use, whole or, where the checkpoint can, a row block at a
    time (`row_blocks`)."""

    ON_USE = ("weight",)

    def read_on_use(self, read: Callable[[], dict[str, Tensor]],
                    row_block: Callable[[int, int], Tensor] | None = None) -> None:
        """`ReadOnUse.read_on_use`; `row_block(r0, r1)` reads rows r0..r1 of the weight alone, where the
        checkpoint can (a GGUF's)."""
        super().read_on_use(read)
        self.__dict__["_row_block"] = row_block

    def row_blocks(self) -> RowBlocks | None:
        """The weight read block by block, while it is not held and the checkpoint can read it so; else None."""
        held, row_block = self._parameters["weight"], self.__dict__.get("_row_block")  # type: ignore[attr-defined]
        if held is not None and held.is_meta and row_block is not None:
            return RowBlocks(held.shape, row_block)
        return None


class HeadOnUse(WeightOnUse, nn.Linear):
    """The output head (an nn.Linear), its weight read on use."""


class EmbeddingOnUse(WeightOnUse, nn.Embedding):
    """The embedding table, not held: each lookup decodes the rows it asks for from the checkpoint (`lookup`, a
    GGUF table kept in its blocks: 2.1 GB of fp32 at 8B never made). Anything that asks for the weight itself
    reads it whole, as any module read on use does."""

    def read_on_use(self, read: Callable[[], dict[str, Tensor]],
                    row_block: Callable[[int, int], Tensor] | None = None,
                    lookup: Callable[[Tensor], Tensor] | None = None) -> None:
        """`WeightOnUse.read_on_use`; `lookup(ids)` gives the rows of token ids [n] as fp32 [n, dim]."""
        super().read_on_use(read, row_block)
        self.__dict__["_lookup"] = lookup

    def lookup(self) -> Callable[[Tensor], Tensor] | None:
        """The row decoder, while the table is not held; else None (the table as held is looked up)."""
        held = self._parameters["weight"]
        return self.__dict__.get("_lookup") if held is not None and held.is_meta else None

    def forward(self, ids: Tensor) -> Tensor:
        lookup = self.lookup()
        if lookup is None:
            return super().forward(ids)
        return lookup(ids.reshape(-1)).reshape(*ids.shape, self.embedding_dim)
