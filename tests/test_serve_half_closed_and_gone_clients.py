"""A client that half-closes its socket after a valid request (shutdown(SHUT_WR)) still gets its answer, even
when it waits in the queue behind another reply; a client that closed its socket entirely is dropped from the
queue and stops a whole (non-streamed) reply it no longer waits for.

On the wire both send the same end of input; only a write tells them apart (a closed socket answers it with a
reset). Each test runs a scripted engine that holds its first reply until the test releases it, and waits on
conditions (queue length, what the server checked, replies ended), never on a fixed sleep."""

from __future__ import annotations

import http.client
import json
import socket
import threading

import httpx
import pytest
from serve_fake_engine import serve_engine
from serve_support import poll, running_server

from parley.app.server.api import Handler

OK = [{"role": "user", "content": "Hi"}]


def post(body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


@pytest.fixture
def checks(monkeypatch) -> list[bool]:
    """What each of the server's is-the-client-gone checks answered, in order."""
    seen: list[bool] = []
    real = Handler._client_gone

    def spy(self: Handler) -> bool:
        seen.append(real(self))
        return seen[-1]

    monkeypatch.setattr(Handler, "_client_gone", spy)
    return seen


def hold_the_engine(url: str, engine) -> tuple[threading.Thread, dict]:
    """A first request that holds the engine (before its first token) until `engine.release` is set."""
    answer: dict = {}

    def first() -> None:
        r = httpx.post(f"{url}/chat/completions", json={"messages": OK, "max_tokens": 8}, timeout=120)
        answer["status"], answer["json"] = r.status_code, r.json()

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    poll(engine.holding.is_set, what="the first reply to hold the engine")
    return thread, answer


def test_a_half_closed_client_waiting_in_the_queue_gets_its_answer(checks):
    engine = serve_engine(replies=["first reply", "the queued answer"], hold_at=0)
    with running_server(engine, timeout=30) as (server, url):
        thread, first = hold_the_engine(url, engine)
        with socket.create_connection(server.server_address[:2], timeout=60) as s:
            s.sendall(post({"messages": OK, "max_tokens": 8}))
            s.shutdown(socket.SHUT_WR)
            poll(lambda: server.queue.waiting == 1 or server.finished, what="the second request to queue")
            # The end of input is there before it queued: let the queue look at it a few times.
            poll(lambda: len(checks) >= 3 or server.finished, what="the queue to check the waiting client")
            queued = server.queue.waiting == 1 and not server.finished
            engine.release.set()
            assert queued, "a half-closed client was treated as gone"
            response = http.client.HTTPResponse(s)  # skips any interim 1xx answer, as every client must
            response.begin()
            assert response.status == 200
            answer = json.loads(response.read())
        thread.join(timeout=120)
        assert answer["choices"][0]["message"]["content"] == "the queued answer"
        assert first["status"] == 200 and first["json"]["choices"][0]["message"]["content"] == "first reply"
        poll(lambda: len(server.finished) == 2, what="both replies to be recorded")
        assert sorted(server.finished) == ["stop", "stop"]


def test_a_closed_client_waiting_in_the_queue_gives_up_its_place():
    engine = serve_engine(replies=["first reply", "never wanted"], hold_at=0)
    with running_server(engine, timeout=30) as (server, url):
        thread, first = hold_the_engine(url, engine)
        s = socket.create_connection(server.server_address[:2], timeout=60)
        s.sendall(post({"messages": OK, "max_tokens": 8}))
        poll(lambda: server.queue.waiting == 1, what="the second request to queue")
        s.close()
        try:
            poll(lambda: server.queue.waiting == 0, what="the closed client to leave the queue")
        finally:
            engine.release.set()  # a failure here must not leave the server's engine held
        assert list(server.finished) == ["cancelled"]
        thread.join(timeout=120)
        assert first["status"] == 200
        assert len(engine.calls) == 1  # the closed client's request never reached the engine


def test_a_closed_client_stops_its_whole_reply():
    words = 20_000
    engine = serve_engine(replies=["w " * words], hold_at=1, context_window=1 << 20, stats_every=None)
    with running_server(engine, timeout=30) as (server, _):
        s = socket.create_connection(server.server_address[:2], timeout=60)
        s.sendall(post({"messages": OK, "max_tokens": words, "stream": False}))
        poll(engine.holding.is_set, what="the reply to start")
        s.close()  # nothing was sent to it yet: a plain end of input, as a half-close would send
        engine.release.set()
        poll(lambda: server.finished and not server.queue.busy, what="the reply to end")
        # Without the check this reply runs to its 20,000 tokens and finishes as "length".
        assert list(server.finished) == ["cancelled"]
        assert engine.calls[0].reason == "cancelled"
        assert len(engine.calls[0].shown) < 2 * words
