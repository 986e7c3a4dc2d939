"""`make chat` (scripts/setup.sh) skips the pip steps once .venv is complete for this pyproject.toml and this
script (a stamp written last), and runs them again when either changes or a run never finished. Before, every
launch re-ran pip for ~20 s. Run against a stand-in python that records what it is asked to do."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup(tree: Path, *args: str) -> str:
    run = subprocess.run(["bash", "scripts/setup.sh", *args], cwd=tree, capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_a_second_launch_does_nothing(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls.log\nexit 0\n')
    python.chmod(0o755)
    calls = tmp_path / "calls.log"

    assert "setup: ready" in setup(tmp_path)
    assert "-m pip" in calls.read_text()
    calls.unlink()
    assert setup(tmp_path).strip() == "setup: .venv is up to date (nothing to do)"
    assert not calls.exists()  # no pip, no python at all

    with open(tmp_path / "pyproject.toml", "a") as f:
        f.write("\n# a new dependency\n")
    assert "setup: ready" in setup(tmp_path)
    assert "-m pip" in calls.read_text()
    calls.unlink()
    (tmp_path / ".venv" / ".setup-app").unlink()  # an interrupted run leaves no stamp: all again
    assert "setup: ready" in setup(tmp_path) and "-m pip" in calls.read_text()
