"""Model files that claim huge sizes, nest deeply or hold values of the wrong JSON type: `parley generate` ends
in one line naming the file and the field, with what to do; no traceback, no memory blow-up, no hang (issue 36).

The cases are `parley bench faults`' own (`broken_inputs`, the ones issue 36 added), run here in-process
through the command line; the bench runs each in a subprocess."""

from __future__ import annotations

import os
import resource
import subprocess
import threading

import pytest

from parley.app import cli
from parley.bench.faults import FIX_WORDS, _generate_cmd, broken_inputs

ISSUE_36 = ("template-nested-list", "template-star-width", "config-model_type-list", "config-model_type-object",
            "config-layer_types-object", "config-layer_types-lists", "config-sliding_window_pattern-0",
            "config-sliding_window_pattern-text", "config-rope-llama3-without-factors", "config-nested-100000",
            "awq-without-qweight", "gguf-kv-2^40", "gguf-tensors-2^40", "gguf-tokens-2^40", "gguf-token_type-2^40")


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("broken")
    return {name: (ref, expected) for name, ref, expected in broken_inputs(root) if name in ISSUE_36}


def test_every_case_is_made(cases):
    assert sorted(cases) == sorted(ISSUE_36)


@pytest.mark.parametrize("name", ISSUE_36)
def test_one_line_naming_the_file_and_what_to_do(cases, name, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref, expected = cases[name]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    status = cli.main(_generate_cmd(ref)[3:])  # the argv after `python -m parley.app.cli`
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    err = capsys.readouterr().err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert status in (1, 2) and "Traceback" not in err, err[-2000:]  # 1: the reply failed (a template)
    assert lines and lines[-1].startswith("parley: error:"), err[-500:]
    assert all(word in lines[-1] for word in expected), (expected, lines[-1])
    assert any(word in lines[-1] for word in FIX_WORDS), lines[-1]
    assert err.count("parley: error:") == 1 and "\n" + lines[-1] in "\n" + err.replace("\r", "\n")
    assert grown_mb < 500, f"{name}: peak memory grew by {grown_mb:.0f} MB"


def test_a_chat_template_fifo_is_refused_not_waited_on(cases, tmp_path):
    fifo = tmp_path / "template.fifo"
    os.mkfifo(fifo)
    good = next(iter(cases.values()))[0].parent / "good"
    cmd = [*_generate_cmd(good), "--chat-template", str(fifo)]
    writer = threading.Timer(300, lambda: open(fifo, "w").close())  # should the read block, unblock it late
    writer.daemon = True
    writer.start()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdin=subprocess.DEVNULL)
    finally:
        writer.cancel()
    lines = [line for line in out.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-1000:]
    assert lines[-1].startswith("parley: error: --chat-template") and "not a regular file" in lines[-1], lines
