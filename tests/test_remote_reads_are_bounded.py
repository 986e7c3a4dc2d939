"""`--server` against servers that never stop sending, send slowly, or send terminal escapes: every read has a
limit in size and in time, and each ends in one line with the server's text escaped (issue 36).

The limits are lowered for these tests (`monkeypatch` on the module's constants); each hostile server keeps
going until the client hangs up, so a missing limit shows as a hang (pytest's timeout) or a memory blow-up (the
peak resident size, checked where a missing limit would add hundreds of MB)."""

from __future__ import annotations

import gzip
import json
import resource
import socket
import time
from collections.abc import Callable

import httpx
import pytest

from parley.app import cli
from parley.bench.faults_network import hostile_server
from parley.engine import remote
from parley.engine.events import Done, TextDelta
from parley.engine.params import GenerationParams
from parley.engine.remote import RemoteEngine

MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x9b31m"
CHUNK = b'data: {"choices": [{"delta": {"content": "w"}}]}\n\n'


@pytest.fixture(autouse=True)
def short_limits(monkeypatch):
    monkeypatch.setattr(remote, "READ_TIMEOUT_S", 30.0)  # between bytes: never what these servers trip
    monkeypatch.setattr(remote, "PROGRESS_TIMEOUT_S", 1.0)
    monkeypatch.setattr(remote, "PROBE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(remote, "MAX_JSON", 1 << 16)


def reply(url: str, max_new_tokens: int = 20) -> list:
    engine = RemoteEngine.connect(url)
    return list(engine.session().reply([{"role": "user", "content": "hi"}],
                                       GenerationParams(max_new_tokens=max_new_tokens)))


def error_of(events: list) -> str:
    done = events[-1]
    assert isinstance(done, Done) and done.reason == "error", events[-3:]
    assert "\n" not in done.detail and "\x1b" not in done.detail and len(done.detail) < 700, done.detail
    return done.detail


def drip(head: bytes, unit: bytes, every: float = 0.05) -> Callable[[socket.socket], None]:
    """Send `head`, then `unit` every `every` seconds, for ever (until the client hangs up)."""
    def answer(conn: socket.socket) -> None:
        conn.sendall(head)
        while True:
            time.sleep(every)
            conn.sendall(unit)
    return answer


def endless(head: bytes, block: bytes) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(head)
        while True:
            conn.sendall(block)
    return answer


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


BOMB = gzip.compress(b"\0" * (512 << 20), compresslevel=9)  # 512 MiB of zeros in about 0.5 MB


@pytest.mark.parametrize("where", ["stream", "models"])
def test_a_gzip_bomb_is_never_inflated(where):
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n")
    sse = lambda conn: conn.sendall(head % (b"text/event-stream", len(BOMB)) + BOMB)  # noqa: E731
    models = (lambda conn: conn.sendall(head % (b"application/json", len(BOMB)) + BOMB)) if where == "models" \
        else MODELS
    before = peak_mb()
    with hostile_server(models, sse) as url:
        if where == "models":
            with pytest.raises(ValueError, match="compressed \\(gzip\\)") as e:
                RemoteEngine.connect(url)
            assert "\n" not in str(e.value)
        else:
            assert "compressed (gzip)" in error_of(reply(url))
    assert peak_mb() - before < 200


@pytest.mark.parametrize(("name", "answer", "words"), [
    ("data lines without a blank line", endless(SSE_HEAD, b"data: " + b"x" * 1000 + b"\n"), "stream event of over"),
    ("empty objects", endless(SSE_HEAD, b"data: {}\n\n"), "events in a row without text"),
    ("empty deltas", endless(SSE_HEAD, b'data: {"choices": [{"delta": {}}]}\n\n'), "events in a row without text"),
])
def test_endless_events_without_text_are_cut(name, answer, words, monkeypatch):
    monkeypatch.setattr(remote, "PROGRESS_TIMEOUT_S", 60.0)  # the count or size limit, not the clock, cuts these
    before = peak_mb()
    with hostile_server(MODELS, answer) as url:
        assert words in error_of(reply(url)), name
    assert peak_mb() - before < 200


@pytest.mark.parametrize(("name", "answer", "words"), [
    ("a status line a byte at a time", drip(b"", b"H"), "no answer (status and headers) for 1 s"),
    ("headers for ever", drip(b"HTTP/1.1 200 OK\r\n", b"X-Pad: 1\r\n"), "no answer (status and headers) for 1 s"),
    ("keep-alive comments for ever", drip(SSE_HEAD, b": ping\n\n"), "no text for 1 s"),
    ("blank lines for ever", drip(SSE_HEAD, b"\n"), "no text for 1 s"),
    ("text, then only pings", drip(SSE_HEAD + CHUNK, b": ping\n"), "no text for 1 s"),
])
def test_a_server_that_trickles_without_text_is_cut_at_the_limit(name, answer, words):
    with hostile_server(MODELS, answer) as url:
        assert words in error_of(reply(url)), name


def test_a_whole_answer_has_a_limit(monkeypatch):
    monkeypatch.setattr(remote, "REPLY_TIMEOUT_S", 1.0)
    monkeypatch.setattr(remote, "PROGRESS_TIMEOUT_S", 30.0)
    with hostile_server(MODELS, drip(SSE_HEAD, CHUNK)) as url:
        events = reply(url, max_new_tokens=100_000)
    assert "whole answer took over 1 s" in error_of(events)
    assert any(isinstance(e, TextDelta) for e in events)


@pytest.mark.parametrize(("name", "models", "words"), [
    ("a model list a byte at a time", drip(b"HTTP/1.1 200 OK\r\n", b" "), "took over 1 s"),
    ("an endless model list", endless(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                                      b"\r\n", b"[" * 4096), "over 65,536 bytes"),
    ("headers over 100 KB", endless(b"HTTP/1.1 200 OK\r\n", b"X-Pad: " + b"p" * 1000 + b"\r\n"), "GET"),
])
def test_the_model_list_is_read_within_bounds(name, models, words):
    with hostile_server(models, lambda conn: None) as url, pytest.raises(ValueError) as e:
        RemoteEngine.connect(url)
    assert words in str(e.value) and "\n" not in str(e.value), (name, str(e.value))


def json_error(message: str) -> Callable[[socket.socket], None]:
    body = json.dumps({"error": {"message": message}}).encode()
    return lambda conn: conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))


def sse_error(message: str) -> Callable[[socket.socket], None]:
    return lambda conn: conn.sendall(SSE_HEAD + b"data: " + json.dumps({"error": {"message": message}}).encode()
                                     + b"\n\n")


@pytest.mark.parametrize("answer", [json_error(f"boom{ESCAPES}"), sse_error(f"boom{ESCAPES}")],
                         ids=["error-answer", "sse-error-event"])
def test_terminal_escapes_from_a_server_are_shown_escaped(answer, capsys):
    with hostile_server(MODELS, answer) as url:
        assert "boom\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m" in error_of(reply(url))
        assert cli.main(["generate", "--server", url, "hi"]) == 1  # through the command a user types
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("parley: error:") and "\x1b" not in err and "\x9b" not in err
    assert "Traceback" not in err


def test_escapes_in_reply_text_and_model_names_are_not_passed_on():
    text = {"choices": [{"delta": {"content": f"hi\n{ESCAPES}"}, "finish_reason": "stop"}]}
    answer = lambda conn: conn.sendall(SSE_HEAD + f"data: {json.dumps(text)}\n\ndata: [DONE]\n\n".encode())  # noqa
    with hostile_server(MODELS, answer) as url:
        events = reply(url)
    shown = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert shown.startswith("hi\n") and "\x1b" not in shown and "\\x1b]0;pwned" in shown
    with hostile_server({"data": [{"id": f"m{ESCAPES}"}]}, answer) as url, \
            pytest.raises(ValueError, match="control characters") as e:
        RemoteEngine.connect(url)
    assert "\x1b" not in str(e.value)


def test_requests_ask_for_no_compression_and_no_reuse():
    seen = []

    def answer(conn: socket.socket) -> None:
        sse_error("x")(conn)

    class Spy(httpx.BaseTransport):
        def __init__(self):
            self.inner = httpx.HTTPTransport()

        def handle_request(self, request):
            seen.append(request.headers)
            return self.inner.handle_request(request)

    with hostile_server(MODELS, answer) as url:
        engine = RemoteEngine.connect(url, client=httpx.Client(transport=Spy()))
        list(engine.session().reply([{"role": "user", "content": "hi"}], GenerationParams(max_new_tokens=2)))
    assert seen and all(h["accept-encoding"] == "identity" and h["connection"] == "close" for h in seen)


def test_a_slow_steady_stream_is_not_cut(monkeypatch):
    """Each piece of text starts the wait over: a reply slower in all than PROGRESS_TIMEOUT_S, but never that
    slow between two pieces, ends normally."""
    monkeypatch.setattr(remote, "PROGRESS_TIMEOUT_S", 3.0)

    def steady(conn: socket.socket) -> None:
        conn.sendall(SSE_HEAD)
        for _ in range(16):
            time.sleep(0.3)
            conn.sendall(CHUNK)
        conn.sendall(b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')

    with hostile_server(MODELS, steady) as url:
        events = reply(url, max_new_tokens=100)
    assert events[-1] == Done("eos") and sum(isinstance(e, TextDelta) for e in events) == 16
