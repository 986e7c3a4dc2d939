"""End to end through the command a user types, on the default INT4 engine: `parley generate --draft-tokens N`
bounds the guesses a round verifies (at most N + 1 tokens a pass) without changing a token of the text, and
the flag left out means the engine's default bound (the CLI's and `GenerationParams`' defaults are one).

How many guesses a pass verifies also follows the measured pass cost, which a busy machine moves: the replies
here price each extra row at a fixed 0.19 one-row passes (`PARLEY_ROW_COST`, the 2-core CPU's measured slope at
this context), so the passes they count are the same on any machine under any load."""

import json
import os
import subprocess
import sys
from importlib import resources

import pytest
from real_engines import int4_path

from parley.app.cli import SAMPLING_FLAGS
from parley.engine.params import GenerationParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def int4() -> str:
    """The INT4 folder a first run writes (the tests' smaller calibration: minutes saved, the same engine code)."""
    return int4_path()


def generate(int4: str, prompt: str, *flags: str) -> tuple[str, dict]:
    out = subprocess.run(
        [sys.executable, "-m", "parley.app.cli", "generate", "--model", int4, "--temperature", "0",
         "--max-new-tokens", "64", "--stats", *flags, prompt],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PARLEY_ROW_COST": "0.19"},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout, json.loads(out.stderr.strip().splitlines()[-1])


def test_the_cli_defaults_are_the_engines():
    params = GenerationParams()
    for name, _, default, _ in SAMPLING_FLAGS:
        assert getattr(params, name) == default, name


def test_draft_tokens_bounds_each_pass_and_never_the_text(int4: str):
    document = resources.files("parley").joinpath("assets/speculative/document.md").read_text()[:3000]
    prompt = "Summarise this document, quoting its key terms.\n\n" + document  # it quotes: long drafts land
    plain, _ = generate(int4, prompt, "--speculation", "off")
    default, stats = generate(int4, prompt)
    one, stats_one = generate(int4, prompt, "--draft-tokens", "1")
    assert default == plain and one == plain
    assert stats["drafter"] == "suffix match" and stats_one["drafter"] == "suffix match"
    assert stats_one["tokens_per_target_pass"] <= 2.0, stats_one  # one guess and the token after it
    assert stats["tokens_per_target_pass"] > 2.0, stats  # the default bound is not 1: whole spans copied
