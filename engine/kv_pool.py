"""The engine's KV caches: a pool of sequence slots, each a `CachedModel` holding one sequence's cache.

Slot-granular, as llama-server's `--parallel` slots: a slot holds a whole context window, because the native
attention reads each cache as one [kv head][position][dim] block per layer (paged blocks would break that
layout). A slot is made the first time every made slot is busy, up to `size`; so a single conversation only ever
uses one (the batch of one), and memory grows with the number of sequences that ran at the same time, never past
`size` windows. Each slot keeps its tokens between replies: a reply takes the free slot sharing the longest prefix
with its prompt (a follow-up turn lands on its own conversation's slot), and only the rest is prefilled; a longer
prefix another slot holds is copied from it (`share_prefix`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from itertools import count

from ..models.weights_dtype import available_bytes
from .cached_model import CachedModel
from .prefix import common_prefix

MAX_DEFAULT_SLOTS = 8  # the default pool never holds more (a pass of 8 decode rows is still memory-bound)
MEMORY_SHARE = 0.25  # of the memory free at start, what the default pool may take at full windows
SHARE_MIN = 16  # prompt tokens another slot must hold beyond a slot's own for their KV to be copied over


def default_slots(slot_bytes: int, free: int | None = None) -> int:
    """PARLEY_PARALLEL, else as many slots as a quarter of the available memory holds at full windows (1 to 8)."""
    env = os.environ.get("PARLEY_PARALLEL", "").strip()
    if env:
        return parse_slots(env, "PARLEY_PARALLEL")
    free = available_bytes() if free is None else free
    if free is None or slot_bytes <= 0:
        return 4
    return max(1, min(MAX_DEFAULT_SLOTS, int(free * MEMORY_SHARE) // slot_bytes))


def parse_slots(value: str | int, where: str = "--parallel") -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{where}={value!r}: expected a positive number of sequences")
    return n


class KVPool:
    """Up to `size` slots made by `make` on demand; `take` hands a free one to a reply, `give_back` frees it."""

    def __init__(self, make: Callable[[], CachedModel], size: int) -> None:
        self.make, self.size = make, size
        self.slots: list[CachedModel] = []
        self._busy: set[int] = set()  # id() of the slots a reply holds
        self._used: dict[int, int] = {}  # id() -> when it was last taken (for ties: the least recent goes)
        self._clock = count()
        self.last: CachedModel | None = None  # the slot the latest reply took

    @property
    def busy(self) -> int:
        return len(self._busy)

    @property
    def free(self) -> int:
        return self.size - len(self._busy)

    def take(self, ids: list[int]) -> CachedModel | None:
        """A free slot for a prompt of `ids`, marked busy; None when all `size` are busy. Among the made free
        slots, the one sharing the longest prefix with `ids` (ties: the least recently used); a new slot only
        when every made one is busy."""
        free = [s for s in self.slots if id(s) not in self._busy]
        if free:
            slot = max(free, key=lambda s: (common_prefix(s.ids, ids), -self._used.get(id(s), -1)))
        elif len(self.slots) < self.size:
            slot = self.make()
            self.slots.append(slot)
        else:
            return None
        self._busy.add(id(slot))
        self._used[id(slot)] = next(self._clock)
        self.last = slot
        return slot

    def held_prefix(self, ids: list[int]) -> int:
        """The longest prefix of `ids` any slot holds (running or free)."""
        return max((common_prefix(s.ids, ids) for s in self.slots), default=0)

    def share_prefix(self, slot: CachedModel, ids: list[int]) -> int:
        """Before `slot` reads the prompt `ids`: where another slot holds a prefix of it at least SHARE_MIN tokens
        longer than `slot` does, copy that slot's KV instead of computing it (several clients with one system
        prompt, or one document). Only where a position's K/V are bitwise what `slot` would compute: the native
        step, and the PyTorch path in ROW_TILE-row tiles (untiled, its K/V depend on the pass's shape). Returns the
        tokens copied."""
        if slot.native is None and not slot.row_tile:
            return 0
        have = common_prefix(slot.ids, ids)
        donor = max((s for s in self.slots if s is not slot), key=lambda s: common_prefix(s.ids, ids), default=None)
        n = common_prefix(donor.ids, ids) if donor is not None else 0
        if n - have < SHARE_MIN:
            return 0
        slot.copy_prefix(donor, n)
        return n - have

    def give_back(self, slot: CachedModel) -> None:
        self._busy.discard(id(slot))

    def first(self) -> CachedModel:
        """The slot a pool-wide verb (the benches' forward) acts on: the latest reply's, else a new first slot."""
        if self.last is None:
            if not self.slots:
                self.slots.append(self.make())
            self.last = self.slots[0]
        return self.last

    def slot_bytes(self) -> int:
        """What one slot's cache takes at its full window."""
        slot = self.first()
        return slot.cache.bytes_per_position() * slot.max_len
