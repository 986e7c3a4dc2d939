"""`parley generate`'s progress never leaves an unended line before the answer or an error: on a terminal the
line is rewritten in place (cleared, not padded to 100 columns, which wraps a narrow one) and ended before the
answer; into a log or a pipe each step is a whole line. Before, stderr read `\\rload: reading the weights …`
with no newline, and the answer or `parley: error: …` ran on after it."""

from __future__ import annotations

import io
import subprocess
import sys

from awq_tiny import outlier_model, write_hf_dir

from parley.app import cli
from parley.models.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_command_a_user_types_into_a_log(tmp_path):
    model = write_hf_dir(outlier_model(), tmp_path / "tiny")
    run = subprocess.run([sys.executable, "-m", "parley.app.cli", "generate", "hi", "--model", str(model),
                          "--quant", "none", "--max-new-tokens", "3", "--temperature", "0"],
                         capture_output=True, timeout=600)  # bytes: text mode would turn \r into \n
    err = run.stderr.decode()
    assert run.returncode == 0, err
    assert run.stdout.strip(), err
    assert "\r" not in err and err.endswith("\n"), repr(err)
    assert any(line.startswith("load: ") for line in err.split("\n")), err


def test_an_error_after_progress_is_a_line_of_its_own(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(cli, "_progress_last", ())
    monkeypatch.setattr(cli.time, "monotonic", lambda: 5.0)  # within one 10 s step
    for _ in range(3):
        cli.print_progress(Progress("load", 0, 0, "", "reading the weights of model.gguf"))
    for i in range(3):  # a layer at a time: at most a line every 10 s
        cli.print_progress(Progress("quantize", i, 30, "layer"))
    print("parley: error: the tokenizer is not valid", file=sys.stderr)
    assert log.getvalue().splitlines() == ["load: reading the weights of model.gguf", "quantize: 0/30 layer",
                                           "parley: error: the tokenizer is not valid"]


def test_on_a_terminal_the_line_is_rewritten_then_ended(monkeypatch):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    cli.print_progress(Progress("load", 0, 0, "", "reading the weights of model.gguf"))
    cli.print_progress(Progress("load", 1, 2, "layer", "preparing the CPU step: layer 1/2"))
    cli.end_progress()
    assert term.getvalue() == ("\r\033[Kload: reading the weights of model.gguf"
                               "\r\033[Kload: preparing the CPU step: layer 1/2\n")
    cli.end_progress()  # ended once
    assert term.getvalue().count("\n") == 1
