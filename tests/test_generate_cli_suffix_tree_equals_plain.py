"""End to end through the command a user types: `parley generate --speculation suffix-tree` on the real
embedded model prints, at temperature 0, exactly the text `--speculation off` prints, and its stats say the
suffix tree drafted (and how many guesses it kept)."""

import json
import os
import subprocess
import sys
from importlib import resources

import pytest

pytestmark = pytest.mark.slow


def generate(prompt: str, speculation: str) -> tuple[str, dict]:
    out = subprocess.run(
        [sys.executable, "-m", "parley.app.cli", "generate", "--quant", "none", "--temperature", "0",
         "--max-new-tokens", "48", "--speculation", speculation, "--stats", prompt],
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout, json.loads(out.stderr.strip().splitlines()[-1])


def test_suffix_tree_prints_what_plain_decoding_prints():
    document = resources.files("parley").joinpath("assets/speculative/document.md").read_text()[:3000]
    prompt = "Summarise this document, quoting its key terms.\n\n" + document
    plain, _ = generate(prompt, "off")
    tree, stats = generate(prompt, "suffix-tree")
    assert tree == plain
    assert stats["drafter"] == "suffix tree" and stats["proposed"] > 0 and stats["accepted"] > 0, stats
