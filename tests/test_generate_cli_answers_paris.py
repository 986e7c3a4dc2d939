"""End to end on the real embedded model: `parley generate` streams a correct answer and its stats."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_capital_of_france_is_paris():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "parley.app.cli", "generate", "--quant", "none", "--temperature", "0",
         "--max-new-tokens", "24", "--stats", "What is the capital of France?"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    stats = json.loads(out.stderr.strip().splitlines()[-1])
    for key in ("new_tokens", "tokens_per_s", "accepted", "proposed", "tokens_per_target_pass", "ttft_s"):
        assert key in stats
    assert stats["new_tokens"] > 0 and stats["tokens_per_s"] > 0


def test_out_of_range_sampling_parameter_is_a_clear_error():
    out = subprocess.run(
        [sys.executable, "-m", "parley.app.cli", "generate", "--top-p", "1.5", "hi"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2
    assert "top_p=1.5 is out of range: expected a number in (0, 1]" in out.stderr
