"""`parley generate` for pipes: the prompt from stdin, a document with --file, a final newline, and a
non-zero exit when nothing was produced or the context overflowed."""

from __future__ import annotations

import io
import json

import pytest
from fake_engine import FakeEngine

from parley.app import cli, generate
from parley.engine.events import Done, Stats, TextDelta


class Stdin(io.StringIO):
    def __init__(self, text: str, tty: bool = False) -> None:
        super().__init__(text)
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def args(*argv: str):
    return cli.build_parser().parse_args(["generate", *argv])


def test_prompt_from_stdin_when_dash_or_absent():
    assert generate.read_prompt(args(), Stdin("What is 2+2?\n")) == "What is 2+2?\n"
    assert generate.read_prompt(args("-"), Stdin("piped")) == "piped"
    assert generate.read_prompt(args("given"), Stdin("ignored")) == "given"
    with pytest.raises(ValueError, match="pipe it in"):
        generate.read_prompt(args(), Stdin("", tty=True))
    with pytest.raises(ValueError, match="empty"):
        generate.read_prompt(args("-"), Stdin("  \n"))


def test_file_is_attached_before_the_prompt(tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_bytes(b"line one\r\nline two\r\n")
    prompt = generate.read_prompt(args("Summarise", "--file", str(doc)), Stdin("", tty=True))
    assert prompt.startswith("line one\nline two") and prompt.endswith("Summarise")
    with pytest.raises(ValueError, match="missing.txt"):
        generate.read_prompt(args("x", "--file", str(tmp_path / "missing.txt")), Stdin("", tty=True))


class ScriptedEngine(FakeEngine):
    """Replies with exactly the events given."""

    def __init__(self, events) -> None:
        super().__init__()
        self.events = events

    def session(self, system_prompt=None):
        engine = self

        class Session:
            def reply(self, messages, params, cancel=None):
                engine.calls.append(messages)
                yield from engine.events

        return Session()


def run_generate(monkeypatch, capsys, events, *argv, stdin="question"):
    from parley.engine.engine import Engine

    engine = ScriptedEngine(events)
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **k: engine))
    monkeypatch.setattr("sys.stdin", Stdin(stdin))
    code = cli.main(["generate", *argv])
    out, err = capsys.readouterr()
    return code, out, err, engine


STATS = Stats(new_tokens=2, tokens_per_s=10.0, accepted=0, proposed=0, tokens_per_target_pass=1.0, ttft_s=0.1)


def test_output_ends_with_a_newline_before_the_stats_line(monkeypatch, capsys):
    code, out, err, engine = run_generate(monkeypatch, capsys, [TextDelta("Par"), TextDelta("is."), STATS,
                                                               Done("eos")], "--stats")
    assert code == 0 and out == "Paris.\n"
    assert engine.calls[0] == [{"role": "user", "content": "question"}]  # read from the pipe
    assert json.loads(err.strip().splitlines()[-1])["done"] == "eos"


def test_no_text_exits_non_zero(monkeypatch, capsys):
    code, out, err, _ = run_generate(monkeypatch, capsys, [Done("eos")], "hi")
    assert code == 1 and out == "" and "produced no text" in err


def test_context_overflow_exits_non_zero(monkeypatch, capsys):
    detail = "the conversation is 9000 tokens; the context window holds 8192."
    code, out, err, _ = run_generate(monkeypatch, capsys, [Done("length", detail)], "hi")
    assert code == 3 and detail in err
    code, out, err, _ = run_generate(monkeypatch, capsys, [TextDelta("a"), Done("length",
                                     "context window of 8192 tokens is full")], "hi")
    assert code == 3 and out == "a\n"


def test_max_tokens_is_not_an_error(monkeypatch, capsys):
    code, out, _, _ = run_generate(monkeypatch, capsys, [TextDelta("a b\n"), Done("length", "max_new_tokens")], "hi")
    assert code == 0 and out == "a b\n"
