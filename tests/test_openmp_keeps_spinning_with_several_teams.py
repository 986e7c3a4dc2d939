"""Importing parley sets libgomp's wait policy before torch loads libgomp (the native step shares torch's).

libgomp cuts its barrier spin from 300,000 rounds to 1,000 once more OpenMP threads exist than cores, and each
thread that ever ran a parallel region keeps a team: the thread that loads the model and the scheduler's thread
that decodes make four on two cores, and each of a pass's barriers then sleeps (a 2-thread decode pass of the
embedded model measured 1.75 ms from the main thread, 6 ms from a second one). libgomp prints what it read with
OMP_DISPLAY_ENV, in a fresh interpreter that imports parley the way the CLI does (before torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _openmp_settings(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(extra, OMP_DISPLAY_ENV="VERBOSE")
    out = subprocess.run([sys.executable, "-c", "import parley.app.cli; import torch; torch.ones(1)"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    settings = {}
    for line in out.stderr.splitlines():
        name, eq, value = line.strip().partition(" = ")
        if eq:
            settings[name] = value.strip("'")
    assert settings, f"libgomp printed no settings:\n{out.stderr[-2000:]}"
    return settings


def test_importing_parley_keeps_the_barrier_spin_of_a_machine_with_one_team() -> None:
    got = _openmp_settings({})
    assert got.get("OMP_WAIT_POLICY") == "ACTIVE", got
    assert got.get("GOMP_SPINCOUNT") == "300000", got


def test_a_policy_the_user_set_stands() -> None:
    got = _openmp_settings({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10"})
    assert got.get("OMP_WAIT_POLICY") == "PASSIVE", got
    assert got.get("GOMP_SPINCOUNT") == "10", got


def test_peers_run_without_the_settings_parley_made() -> None:
    """llama.cpp, run beside Parley by the benches, gets the environment its users give it: what importing parley
    set is left out, what the user set is passed on."""
    code = ("import json; from parley.bench.harness import peer_env; e = peer_env({'X': '1'}); "
            "print(json.dumps([e.get(k) for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT', 'X')]))")
    for given, want in (({}, [None, None, "1"]), ({"GOMP_SPINCOUNT": "10"}, [None, "10", "1"])):
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        out = subprocess.run([sys.executable, "-c", code], env={**env, **given}, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip().splitlines()[-1] == json.dumps(want), (given, out.stdout)
