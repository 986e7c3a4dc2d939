"""Importing parley asks torch for transparent huge pages on its large CPU allocations (the packed weights a
decode pass streams, with 4 KB pages, walk the page tables every 4 KB of each stream), unless the user set
THP_MEM_ALLOC_ENABLE. Checked in a fresh interpreter that imports parley the way the CLI does (before torch):
torch reads the setting at its first allocation. Where the kernel grants huge pages only to regions that ask
(`madvise`, the usual setting), the asking is what decides whether a 64 MB tensor gets them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, os
import parley.app.cli
import torch
t = torch.ones(64 << 20, dtype=torch.uint8)
try:
    rollup = dict(line.split(":", 1) for line in open("/proc/self/smaps_rollup").read().splitlines()[1:])
    huge_kb = int(rollup["AnonHugePages"].split()[0])
except (OSError, KeyError, ValueError):  # no such file on this kernel: only the setting is checked
    huge_kb = None
print(json.dumps({"env": os.environ.get("THP_MEM_ALLOC_ENABLE"), "huge_kb": huge_kb}))
"""
MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _probe(extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _kernel_mode() -> str | None:
    try:
        text = MODE.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else None


def test_importing_parley_asks_for_huge_pages() -> None:
    got = _probe({})
    assert got["env"] == "1", got
    if _kernel_mode() in ("madvise", "always") and got["huge_kb"] is not None:
        assert got["huge_kb"] > 0, got


def test_a_setting_the_user_made_stands() -> None:
    got = _probe({"THP_MEM_ALLOC_ENABLE": "0"})
    assert got["env"] == "0", got
    if _kernel_mode() == "madvise" and got["huge_kb"] is not None:
        assert got["huge_kb"] == 0, got
