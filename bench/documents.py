"""The documents `parley bench speculative --documents` summarises: a folder's text files, or by default a
held-out suite of public texts that Debian ships, read on this machine at run time.

Why these: the project did not write them and never tuned on them, and a new user pastes exactly such
text (a manual page, a licence, a library's reference). Manual pages are rendered as a reader sees them
(`man -P cat`); a text missing from this image is skipped with a note, never substituted.
"""

from __future__ import annotations

import gzip
import os
import pydoc
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

# (name, how to read it): man pages of the base system and of apt, licences, a dpkg spec, Python's own docs
SUITE: tuple[tuple[str, str], ...] = (
    ("man tar", "man:tar"), ("man grep", "man:grep"), ("man find", "man:find"), ("man apt-get", "man:apt-get"),
    ("GPL-3", "file:/usr/share/common-licenses/GPL-3"), ("MPL-2.0", "file:/usr/share/common-licenses/MPL-2.0"),
    ("Artistic", "file:/usr/share/common-licenses/Artistic"),
    ("dpkg triggers spec", "file:/usr/share/doc/dpkg/spec/triggers.txt"),
    ("python json", "pydoc:json"), ("python heapq", "pydoc:heapq"),
)


def man_page(name: str) -> str | None:
    """The manual page as `man` shows it (80 columns, no formatting), or None when it is not installed."""
    if shutil.which("man"):
        run = subprocess.run(["man", "-P", "cat", name], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "MANWIDTH": "80", "MAN_KEEP_FORMATTING": "", "LC_ALL": "C.UTF-8"})
        if run.returncode == 0 and run.stdout.strip():
            return run.stdout
    return None


def read(source: str) -> str | None:
    """The text a suite entry names, or None when this machine lacks it."""
    kind, _, what = source.partition(":")
    if kind == "man":
        return man_page(what)
    if kind == "pydoc":
        try:
            return pydoc.plain(pydoc.render_doc(what, renderer=pydoc.plaintext))
        except ImportError:
            return None
    path = Path(what)
    if not path.is_file():
        return None
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8", errors="replace")


def suite() -> tuple[list[tuple[str, str]], list[str]]:
    """The default suite's (name, text) pairs on this machine, and a note for each one missing."""
    docs, notes = [], []
    for name, source in SUITE:
        text = read(source)
        if text and text.strip():
            docs.append((name, text))
        else:
            notes.append(f"{name} ({source}) is not on this machine: skipped")
    return docs, notes


def folder(path: str) -> list[tuple[str, str]]:
    """Every regular file of `path` (sorted; .gz decompressed), as (file name, text)."""
    root = Path(path)
    if not root.is_dir():
        raise SystemExit(f"--documents {path}: not a folder; give a folder of text files, or leave the value "
                         "out for the built-in suite of Debian-shipped texts")
    docs = []
    for p in sorted(root.iterdir()):
        if p.is_file():
            try:
                data = p.read_bytes()
                docs.append((p.name, (gzip.decompress(data) if p.suffix == ".gz" else data).decode("utf-8")))
            except (OSError, UnicodeDecodeError, gzip.BadGzipFile) as e:
                raise SystemExit(f"--documents {path}: cannot read {p.name} as UTF-8 text ({e}); "
                                 "leave only text files in the folder") from None
    if not docs:
        raise SystemExit(f"--documents {path}: the folder holds no files; put text files in it")
    return docs


def trim(text: str, count: Callable[[str], int], budget: int) -> str:
    """`text` cut at a line end so that it holds at most ~`budget` tokens (`count`: the tokenizer's count)."""
    n = count(text)
    while n > budget:
        cut = text[: max(1, int(len(text) * budget / n * 0.97))]
        text = cut[: cut.rfind("\n")] if "\n" in cut[len(cut) // 2 :] else cut
        n = count(text)
    return text
