"""With one KV slot (--parallel 1) requests take turns: one runs, `--queue-size` wait in order, the next gets 429."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from serve_support import poll, real_engine, running_server

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def one_slot():
    return real_engine().fresh(parallel=1)


def test_one_runs_one_waits_the_next_is_told_busy():
    with running_server(one_slot(), queue_size=1) as (server, url):
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        model = real_engine().model_name
        running = client.chat.completions.create(model=model, messages=PROMPT, temperature=0, max_tokens=400,
                                                 stream=True)
        next(iter(running))  # the first chunk: this request holds the engine
        assert server.queue.busy

        waited: dict = {}
        waiter = threading.Thread(target=lambda: waited.update(reply=client.chat.completions.create(
            model=model, messages=PROMPT, temperature=0, max_tokens=5)))
        waiter.start()
        poll(lambda: server.queue.waiting == 1, what="the second request to queue")

        with pytest.raises(openai.RateLimitError) as busy:
            client.chat.completions.create(model=model, messages=PROMPT, temperature=0, max_tokens=5)
        assert busy.value.status_code == 429 and "busy" in busy.value.message
        assert busy.value.response.headers["retry-after"] == "1"

        running.close()  # frees the engine; the waiting request runs to completion
        waiter.join(timeout=300)
        assert waited["reply"].choices[0].finish_reason == "length"
        assert waited["reply"].usage.completion_tokens == 5
        assert list(server.finished) == ["cancelled", "length"]


def test_a_waiting_client_that_leaves_gives_up_its_place():
    with running_server(one_slot(), queue_size=1) as (server, url):
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        model = real_engine().model_name
        running = client.chat.completions.create(model=model, messages=PROMPT, temperature=0, max_tokens=400,
                                                 stream=True)
        next(iter(running))
        # A raw request: the client library would block until its turn (the headers come only then).
        body = json.dumps({"model": model, "messages": PROMPT, "max_tokens": 400}).encode()
        waiting = socket.create_connection(server.server_address[:2])
        waiting.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        poll(lambda: server.queue.waiting == 1, what="the second request to queue")
        waiting.close()
        poll(lambda: server.queue.waiting == 0, what="the waiting request to leave the queue")
        running.close()
        poll(lambda: len(server.finished) == 2 and not server.queue.busy, what="both to end")
        assert list(server.finished) == ["cancelled", "cancelled"]
