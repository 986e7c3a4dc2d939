"""While the native step packs (kernels.native.reused_heap), glibc's malloc serves large blocks from its heap and
keeps what is freed there, so packing one matrix after another faults in fewer fresh pages (each one zeroed by
the kernel) than with glibc's defaults, where every large temporary is mmapped afresh; afterwards large blocks
are mmapped again. Seen through glibc's counters (`mallinfo2`) and the process's minor page faults; that a
freed block stays in the heap (no trim while packing), through the heap's size around a plain malloc and free.

Why page faults and not the heap's size: a freed block is not always reused by the next block of its size.
torch allocates with `posix_memalign`, which takes a little more than the block from the heap and frees the
rest at once; that rest can wait in glibc's per-thread cache, counted as in use, so the freed block does not
merge with its neighbour and the next block of the same size does not fit in it (a loop of 64 MB torch blocks
can grow the heap by 64 MB every round, depending on where the blocks fall). Packing's temporaries of several
sizes do merge and get reused after a few matrices, which is what the fault count sees.

Checked in processes of their own, with transparent huge pages off (`prctl`), so that the fault counts are of
4 KiB pages whatever the machine's setting, and no earlier test has left holes in the heap."""

from __future__ import annotations

import contextlib
import ctypes
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from parley.kernels import native

ROUNDS = 16  # matrices packed one after another in each process


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2


def _mmapped_by(n: int) -> int:
    import torch

    info = _mallinfo2()
    before = info().hblkhd
    t = torch.empty(n, dtype=torch.uint8)
    grown = info().hblkhd - before
    del t
    return grown



def _kept_on_free(n: int) -> None:
    """A block from the top of a fresh heap (plain malloc: no alignment tail), freed: the heap keeps it."""
    libc, info = ctypes.CDLL(None), _mallinfo2()
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = info()
    block = libc.malloc(n)
    ctypes.memset(block, 1, n)
    taken = info()
    libc.free(block)
    after = info()
    assert taken.hblkhd == before.hblkhd and taken.arena - before.arena >= n - (1 << 20), "not from the heap"
    assert after.arena == taken.arena, f"the heap gave back {(taken.arena - after.arena) >> 20} MB on a free"
    libc.malloc_trim(0)  # given back now: what follows starts on a heap without 64 MB faulted in and free


def check(reuse: bool) -> None:
    """Prints the pages of one packed matrix and the minor page faults of each of ROUNDS matrices packed one
    after another (results kept, as the step keeps them), inside reused_heap or not."""
    import torch

    PR_SET_THP_DISABLE = 41
    ctypes.CDLL(None).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)
    assert _mmapped_by(64 << 20) >= 64 << 20  # glibc's default: a block this large is mmapped
    gen = torch.Generator().manual_seed(0)
    n, k, group = 4096, 4096, 128
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    zeros = torch.randint(0, 16, (n, k // group), dtype=torch.uint8, generator=gen)
    scales = torch.rand(n, k // group, generator=gen).half().float()
    faults, kept = [], []
    with native.reused_heap() if reuse else contextlib.nullcontext():
        if reuse:
            _kept_on_free(64 << 20)
        assert (_mmapped_by(64 << 20) == 0) == reuse
        for _ in range(ROUNDS):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            kept.append(native.pack_q4_rows(q, zeros, scales, group))
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    assert _mmapped_by(64 << 20) >= 64 << 20  # and mmapped again afterwards
    pages = sum(t.numel() * t.element_size() for t in kept[0].values()) // 4096
    print(json.dumps([pages, faults]))


def _faults(reuse: bool) -> tuple[int, list[int]]:
    here = Path(__file__).parent
    out = subprocess.run([sys.executable, "-c", f"import {Path(__file__).stem} as t; t.check({reuse})"],
                         cwd=here, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    pages, faults = json.loads(out.stdout.splitlines()[-1])
    return pages, faults


def test_packing_reuses_freed_temporaries_and_mmaps_again_afterwards():
    if not hasattr(ctypes.CDLL(None), "mallinfo2") or native._libc() is None or sys.platform != "linux":
        pytest.skip("not Linux with glibc >= 2.33: packing runs without reused_heap")
    pages, reused = _faults(True)
    _, mmapped = _faults(False)
    seen = f"a packed matrix is {pages} pages; page faults per matrix: {reused} reused, {mmapped} mmapped"
    # Without reuse every matrix faults in its temporaries afresh, twice its own size or more.
    assert min(mmapped[1:]) >= 2 * pages, seen
    # With it, once the heap has grown and its holes have merged (a few matrices; when depends on where blocks
    # fall), a matrix faults in little more than its own pages: every temporary comes from freed memory.
    assert min(reused[1:]) <= 1.25 * pages, seen
