"""`--server` against a broken or hostile server: a one-line error, never a traceback, a hang or unbounded memory.

Each case is one the probe of issue 25 found raising, hanging or growing without bound: malformed model
lists and stream events, an HTML page, a server that says nothing (read timeout, 0.5 s here), one that ignores
max_tokens, one that sends an endless line."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

import httpx
import pytest
from fake_openai_server import fake_server

from parley.bench.faults_network import hostile_server
from parley.engine.events import Done, TextDelta
from parley.engine.params import GenerationParams
from parley.engine.remote import MAX_QUIET_LINES, RemoteEngine, iter_sse, sse_lines

MODELS = {"/v1/models": {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}}
HI = [{"role": "user", "content": "hi"}]


def short_client() -> httpx.Client:
    return httpx.Client(timeout=httpx.Timeout(5.0, read=0.5))


def reply(engine: RemoteEngine, **params) -> list:
    return list(engine.session().reply(HI, GenerationParams(**{"max_new_tokens": 20, **params})))


@pytest.mark.parametrize("data", [["m"], {"id": "m"}, [None], [{"id": 5}], "m"])
def test_malformed_model_lists_are_one_line_errors(data):
    with fake_server({"/v1/models": {"data": data}}, []) as (_, url):
        with pytest.raises(ValueError, match="malformed model list|did not answer an OpenAI model list") as e:
            RemoteEngine.connect(url, client=short_client())
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("event", [
    "42", "[1, 2]", '"x"', "null", '{"choices": 5}', '{"choices": ["x"]}', '{"choices": [{"delta": "x"}]}',
    '{"usage": "x", "choices": []}', '{"choices": [{"delta": {"content": 5}}]}',
    '{"choices": [{"delta": {"content": "a"}, "finish_reason": 7}]}', "[" * 5000,
])
def test_malformed_stream_events_end_the_reply_with_one_line(event):
    with fake_server(MODELS, [[event, "[DONE]"]]) as (_, url):
        engine = RemoteEngine.connect(url, client=short_client())
        events = reply(engine)
    done = events[-1]
    assert isinstance(done, Done) and done.reason == "error", events
    assert "\n" not in done.detail and ("malformed" in done.detail or "not JSON" in done.detail), done.detail


def test_figures_of_the_wrong_type_are_ignored():
    chunk = {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}],
             "usage": {"completion_tokens": "abc", "prompt_tokens": [1], "parley": "x"}}
    with fake_server({"/v1/models": {"data": [{"id": "m", "max_model_len": "abc"}]}},
                     [[json.dumps(chunk), "[DONE]"]]) as (_, url):
        engine = RemoteEngine.connect(url, client=short_client())
        events = reply(engine)
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["ok"] and events[-1] == Done("eos")


def raw_server(answer: Callable[[socket.socket], None]):
    """Answers GET /v1/models properly and every POST with `answer(connection)` (the faults bench's server)."""
    return hostile_server(MODELS["/v1/models"], answer)


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


def silent(conn: socket.socket) -> None:
    while conn.recv(65536):  # the request's body, then nothing until the client gives up and closes
        pass


def status_line_only(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    silent(conn)


def stalls_mid_stream(conn: socket.socket) -> None:
    conn.sendall(SSE_HEAD + b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n')
    silent(conn)


@pytest.mark.parametrize("answer", [silent, status_line_only, stalls_mid_stream])
def test_a_silent_server_times_out_with_one_line(answer):
    with raw_server(answer) as url:
        engine = RemoteEngine.connect(url, client=short_client())
        done = reply(engine)[-1]
    assert done.reason == "error" and "sent nothing for 0.5 s" in done.detail, done


def endless_chunks(conn: socket.socket) -> None:
    conn.sendall(SSE_HEAD)
    chunk = b'data: {"choices": [{"delta": {"content": "w"}}]}\n\n'
    for _ in range(200_000):
        conn.sendall(chunk)


def test_max_new_tokens_is_enforced_on_the_client():
    with raw_server(endless_chunks) as url:
        engine = RemoteEngine.connect(url, client=short_client())
        events = reply(engine, max_new_tokens=50)
    texts = [e for e in events if isinstance(e, TextDelta)]
    assert len(texts) == 50 and events[-1].reason == "length", events[-1]


def endless_line(conn: socket.socket) -> None:
    conn.sendall(SSE_HEAD + b"data: ")
    block = b"x" * (1 << 16)
    for _ in range(1024):  # 64 MiB, unless the client hangs up first
        conn.sendall(block)


def test_an_endless_line_is_refused():
    with raw_server(endless_line) as url:
        engine = RemoteEngine.connect(url, client=short_client())
        done = reply(engine)[-1]
    assert done.reason == "error" and "line of over" in done.detail, done


def html_page(conn: socket.socket) -> None:
    body = b"<!DOCTYPE html><html><body>Welcome to nginx</body></html>"
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                 % (len(body), body))


def test_an_html_page_is_named_as_such():
    with raw_server(html_page) as url:
        engine = RemoteEngine.connect(url, client=short_client())
        done = reply(engine)[-1]
    assert done.reason == "error" and "web page" in done.detail, done


def test_event_stream_lines_are_bounded():
    assert list(sse_lines([b"data: a\r", b"\ndata: b\n", b"\nda", b"ta: c"])) == ["data: a", "data: b", "",
                                                                                   "data: c"]
    with pytest.raises(ValueError, match="line of over 8 bytes"):
        list(sse_lines([b"data: 12", b"345\n"], max_line=8))
    with pytest.raises(ValueError, match="without data"):
        list(iter_sse([": keep-alive"] * (MAX_QUIET_LINES + 1)))


def endless_error(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
    for _ in range(1024):  # 64 MiB of error page, unless the client hangs up first
        conn.sendall(b"busy " * 13107)


def json_error(conn: socket.socket) -> None:
    body = b'{"error": {"message": "model is loading"}}'
    conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                 b"Connection: close\r\n\r\n%s" % (len(body), body))


@pytest.mark.parametrize(("answer", "words"), [(json_error, "answered 503: model is loading"),
                                               (endless_error, "answered 503: busy busy")])
def test_an_error_answer_is_one_line_read_within_bounds(answer, words):
    with raw_server(answer) as url:
        engine = RemoteEngine.connect(url, client=short_client())
        done = reply(engine)[-1]
    assert done.reason == "error" and words in done.detail and "\n" not in done.detail, done
