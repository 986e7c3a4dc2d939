"""Parley's remote backend against `parley serve`: each tests the other. Over HTTP, a reply is the engine's own
reply; a slider moved mid-reply continues it in a new request; Esc closes the stream and the server stops."""

from __future__ import annotations

import threading

import pytest
from serve_support import poll, real_engine, running_server

from parley.engine.events import Done, Stats, TextDelta
from parley.engine.params import GenerationParams
from parley.engine.remote import RemoteEngine

pytestmark = pytest.mark.slow

POEM = [{"role": "user", "content": "Write a poem about the sea."}]


@pytest.fixture(scope="module")
def served():
    with running_server() as (server, url):
        yield server, RemoteEngine.connect(url)


def text(events) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def local(messages, max_new_tokens: int) -> str:
    params = GenerationParams(temperature=0.0, max_new_tokens=max_new_tokens)
    return text(real_engine().session().reply(messages, params))


def posts(server) -> int:
    return sum("POST" in line for line in server.logged)


def test_connect_learns_the_server(served):
    server, remote = served
    engine = real_engine()
    assert (remote.kind, remote.model_name, remote.context_window) == ("parley", engine.model_name,
                                                                      engine.context_window)
    caps = remote.capabilities
    assert set(caps.unsupported) == {"kv_cache"} and caps.live_params and caps.speculation


def test_reply_over_http_is_the_engines_reply(served):
    server, remote = served
    expected = local(POEM, 20)
    system = "You are a pirate. Speak like a pirate."
    events = list(remote.session(system).reply(POEM, GenerationParams(temperature=0.0, max_new_tokens=20)))
    direct = text(real_engine().session(system).reply(POEM, GenerationParams(temperature=0.0, max_new_tokens=20)))
    assert text(events) == direct and direct != expected  # the system prompt travelled
    assert events[-1] == Done("length", "max_new_tokens=20 reached")
    stats = [e for e in events if isinstance(e, Stats)][-1]
    assert stats.new_tokens == 20 and stats.tokens_per_s > 0 and stats.prompt_tokens + stats.reused_tokens > 0


def test_slider_moved_mid_reply_continues_the_reply(served):
    server, remote = served
    expected = local(POEM, 24)
    params = GenerationParams(temperature=0.0, max_new_tokens=24)
    before = posts(server)
    events = []
    for ev in remote.session().reply(POEM, params):
        events.append(ev)
        if isinstance(ev, TextDelta) and len([e for e in events if isinstance(e, TextDelta)]) == 3:
            params.top_k = 3  # greedy stays greedy: the continued reply must equal the uninterrupted one
    assert posts(server) - before == 2  # the first request, then its continuation
    assert text(events) == expected
    assert events[-1].reason == "length"


def test_lowering_max_tokens_mid_reply_stops_it(served):
    server, remote = served
    params = GenerationParams(temperature=0.0, max_new_tokens=200)
    events = []
    for ev in remote.session().reply(POEM, params):
        events.append(ev)
        if isinstance(ev, TextDelta):
            params.max_new_tokens = 1
    assert events[-1] == Done("length", "max_new_tokens=1 reached")
    assert len([e for e in events if isinstance(e, TextDelta)]) == 1


def test_cancel_closes_the_stream_and_the_server_stops(served):
    server, remote = served
    cancel = threading.Event()
    params = GenerationParams(temperature=0.0, max_new_tokens=400)
    before = len(server.finished)
    events = []
    for ev in remote.session().reply(POEM, params, cancel):
        events.append(ev)
        if isinstance(ev, TextDelta):
            cancel.set()
    assert events[-1] == Done("cancelled")
    poll(lambda: len(server.finished) > before and not server.queue.busy, what="the server to stop")
    assert server.finished[-1] == "cancelled"
