"""`parley serve` decodes several clients together and stays bounded: with --parallel 2, two streams run at once
(each told it shares the engine), a third request waits for a slot, a fourth is refused with 429, Retry-After and
a one-line reason; a client that drops frees its slot at once for the waiting one. Two remote sessions (what two
`parley web` tabs are) stream at the same time, each reply the one it gets alone, the second told it shared the
engine (what its status bar shows)."""

from __future__ import annotations

import copy
import http.client
import json
import threading

import pytest
from serve_support import poll, real_engine, running_server

from parley.engine import scheduler
from parley.engine.events import TextDelta, consume
from parley.engine.params import GenerationParams
from parley.engine.remote import RemoteEngine

pytestmark = pytest.mark.slow

LONG = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
SHORT = [{"role": "user", "content": "Name three colours."}]


def endless(parallel: int):
    """The real engine with `parallel` slots whose replies end only at max_tokens (no stop token), so a stream
    is still running in the engine however fast it decodes."""
    engine = real_engine().fresh(parallel=parallel)
    engine.tokenizer = copy.copy(engine.tokenizer)
    engine.tokenizer.stop_ids = frozenset()
    return engine


def open_stream(server, messages, max_tokens: int):
    """A streamed request on a raw connection, read up to its first text chunk; (connection, response). The response
    owns the socket (the server closes after a stream): the client holds its stream as long as it holds that."""
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=300)
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "speculation": "off"}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    for raw in resp:
        if b'"content": "' in raw and b'"content": ""' not in raw:
            break
    return conn, resp


def post(server, messages, max_tokens: int) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=300)
    try:
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), json.loads(resp.read())
    finally:
        conn.close()


def test_two_run_one_waits_the_next_is_refused_and_a_dropped_client_frees_its_slot(monkeypatch):
    # Once both streams run, the engine's passes wait on a gate: on a busy machine two streams could otherwise
    # reach max_tokens (and free their slots) before the third request is queued.
    gate = threading.Event()
    gate.set()
    forward = scheduler.forward_batch

    def gated(parts):
        gate.wait()
        return forward(parts)

    monkeypatch.setattr(scheduler, "forward_batch", gated)
    with running_server(endless(parallel=2), queue_size=1) as (server, _):
        first = open_stream(server, LONG, 4000)
        second = open_stream(server, LONG, 4000)
        gate.clear()
        assert server.queue.running == 2

        waited: dict = {}
        waiter = threading.Thread(target=lambda: waited.update(answer=post(server, SHORT, 5)), daemon=True)
        waiter.start()
        poll(lambda: server.queue.waiting == 1, what="the third request to wait for a slot")

        status, headers, body = post(server, SHORT, 5)
        assert status == 429 and headers.get("Retry-After") == "1"
        message = body["error"]["message"]
        assert "\n" not in message and "--parallel" in message and "--queue-size" in message

        for part in first:  # a client that drops: its slot goes to the waiting request
            part.close()
        gate.set()
        waiter.join(timeout=300)
        status, _, answer = waited["answer"]
        assert status == 200 and answer["usage"]["completion_tokens"] == 5
        for part in second:
            part.close()
        poll(lambda: not server.queue.busy and len(server.finished) == 3, what="every reply to end")
        # (the dropped streams end "cancelled", or "length" where the engine had finished before they read it)
        assert set(server.finished) <= {"cancelled", "length"}
        assert server.engine.pool.busy == 0


def test_two_remote_sessions_stream_at_once_each_its_own_reply(monkeypatch):
    # Every pass waits for both handlers to take their events (they do at once; the clients' sockets hold the
    # rest): with the default 20 ms grace, a handler descheduled on a busy machine would make tab A sit out tab B's
    # last pass, and B would be told batch 1.
    monkeypatch.setattr(scheduler, "GRACE_S", 300.0)
    engine = real_engine().fresh(parallel=2)
    params = GenerationParams(temperature=0, max_new_tokens=12, speculation="off")
    alone = consume(engine.session().reply(SHORT, params)).text
    with running_server(engine) as (server, url):
        tab_a, tab_b = RemoteEngine.connect(url), RemoteEngine.connect(url)
        long = tab_a.session().reply(LONG, GenerationParams(temperature=0, max_new_tokens=300, speculation="off"))
        first = next(ev for ev in long if isinstance(ev, TextDelta))  # tab A is streaming
        assert first.text
        beside = consume(tab_b.session().reply(SHORT, params))  # tab B streams meanwhile
        assert beside.text == alone and beside.done.reason == "length"
        assert beside.stats.batch == 2, beside.stats
        assert server.queue.running >= 1  # tab A's reply is still running
        long.close()
