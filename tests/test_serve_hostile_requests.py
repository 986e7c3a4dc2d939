"""A hostile or careless client gets a 4xx naming what was wrong, never a 500 with internal text, never a hang.

Each case is one the probe of issue 25 found answering 500 or holding a thread forever. The server runs
over a scripted engine with a short socket timeout (0.5 s), so a silent client is dropped quickly; every wait
here is on a socket answer, never a fixed sleep."""

from __future__ import annotations

import json
import socket
import struct

import httpx
import pytest
from serve_fake_engine import serve_engine
from serve_support import poll, running_server

from parley.app.server.api import make_server
from parley.bench.faults_network import exchange

OK = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def served():
    engine = serve_engine(context_window=256)
    with running_server(engine, timeout=0.5) as (server, url):
        yield server, url, engine


def raw(server, data: bytes, *, shut_write: bool = False) -> bytes:
    """Send bytes on a fresh connection and read until the server closes it (or 60 s pass: a hang)."""
    return exchange(server.server_address[:2], data, shut_write=shut_write)


def post(body: bytes, length: int | None = None, path: str = "/v1/chat/completions") -> bytes:
    n = len(body) if length is None else length
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n"
            "Connection: close\r\n\r\n").encode() + body


def error_of(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"seed": 2**64}, "seed", "64-bit"),
    ({"seed": -2**70}, "seed", "64-bit"),
    ({"messages": [{"role": "user", "content": "x\ud800y"}]}, "messages[0].content", "lone surrogate"),
    ({"stop": ["\udfff"]}, "stop", "lone surrogate"),
    ({"messages": [{"role": "user", "content": "x" * 200_000}]}, "messages", "characters"),
])
def test_bad_values_are_400_naming_the_field(served, body, param, words):
    server, url, _ = served
    data = json.dumps({"messages": OK, "max_tokens": 2, **body}).encode()  # \\u escapes carry lone surrogates
    resp = httpx.post(f"{url}/chat/completions", content=data, timeout=60,
                      headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_deep_nesting_and_bad_lengths_are_400(served):
    server, _, _ = served
    status, error = error_of(raw(server, post(b"[" * 100_000)))
    assert status == 400 and "deeply" in error["message"]
    status, error = error_of(raw(server, post(b"{}", length=-5)))
    assert status == 400 and error["param"] == "Content-Length"
    status, error = error_of(raw(server, (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                          b"Content-Length: abc\r\nConnection: close\r\n\r\n")))
    assert status == 400 and error["param"] == "Content-Length"


def test_a_body_shorter_than_its_content_length_times_out_with_408(served):
    server, _, _ = served
    status, error = error_of(raw(server, post(b'{"messages": []}', length=1000)))
    assert status == 408 and "did not arrive" in error["message"]


def test_half_sent_requests_are_dropped(served):
    """A request line and half its headers, then silence: the server closes the connection (no thread held)."""
    server, _, _ = served
    assert raw(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le") == b""


def test_a_client_that_half_closes_after_its_request_gets_its_answer(served):
    server, _, engine = served
    body = json.dumps({"messages": OK, "max_tokens": 3}).encode()
    answer = raw(server, post(body), shut_write=True)
    while answer.startswith(b"HTTP/1.1 1"):  # interim answers (100 Continue) come first; clients skip them
        answer = answer.partition(b"\r\n\r\n")[2]
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.split()[1] == b"200", answer[:200]
    assert json.loads(payload)["choices"][0]["finish_reason"] == "length"


def test_internal_errors_carry_no_internal_text():
    engine = serve_engine(fail_at=0)
    with running_server(engine) as (server, url):
        resp = httpx.post(f"{url}/chat/completions", json={"messages": OK}, timeout=60)
        assert resp.status_code == 500
        assert "scripted failure" not in resp.text and "/" not in resp.json()["error"]["message"]
        assert any("scripted failure" in line for line in server.logged)  # the details are in the log


def test_a_flood_is_refused_before_its_prompt_is_tokenized():
    engine = serve_engine(hold_at=0)
    with running_server(engine, queue_size=0) as (server, url), httpx.Client(timeout=60) as client, client.stream(
            "POST", f"{url}/chat/completions", json={"messages": OK, "stream": True}) as held:
        try:
            assert held.status_code == 200
            poll(engine.holding.is_set, what="the first reply to hold the engine")
            calls = engine.tokenizer.calls
            resp = httpx.post(f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "y" * 30_000}]},
                              timeout=60)
            assert resp.status_code == 429
            assert engine.tokenizer.calls == calls, "the refused prompt was tokenized"
        finally:
            engine.release.set()  # the held reply ends, so the server stops at once whatever failed


def test_connections_beyond_the_cap_get_503_at_once():
    with running_server(serve_engine(), timeout=30, max_connections=2) as (server, url):
        idle = [socket.create_connection(server.server_address[:2], timeout=60) for _ in range(2)]
        try:
            poll(lambda: server._slots._value == 0, what="both connections to hold a slot")
            assert raw(server, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").startswith(b"HTTP/1.1 503")
        finally:
            for s in idle:
                s.close()
        poll(lambda: server._slots._value == 2, what="the slots to come back")
        assert httpx.get(f"{url}/models", timeout=60).status_code == 200


def test_a_burst_of_connections_waits_in_the_listen_queue():
    """Clients connecting at once while nothing accepts (a busy accept loop) all complete their handshake in the
    kernel's queue: with socketserver's default backlog of 5, the rest were dropped and retried after a second."""
    server = make_server(serve_engine(), "127.0.0.1", 0)
    burst = []
    try:
        for _ in range(32):  # serve_forever is not running: none is accepted
            burst.append(socket.create_connection(server.server_address[:2], timeout=30))
    finally:
        for s in burst:
            s.close()
        server.server_close()
    assert len(burst) == 32


def test_a_reset_keep_alive_connection_logs_no_traceback(served, capfd):
    server, _, _ = served
    s = socket.create_connection(server.server_address[:2], timeout=60)
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert s.recv(65536).startswith(b"HTTP/1.1 200")
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    s.close()
    assert httpx.get(f"{server_url(server)}/models", timeout=60).status_code == 200
    assert "Traceback" not in capfd.readouterr().err


def server_url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"
