"""A client that closes its stream mid-reply cancels it: the engine stops, the next request is served."""

from __future__ import annotations

import pytest
from serve_support import poll, real_engine, running_server

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

LONG = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def test_closing_the_stream_cancels_the_reply():
    with running_server() as (server, url):
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        model = real_engine().model_name
        stream = client.chat.completions.create(model=model, messages=LONG, temperature=0, max_tokens=400,
                                                stream=True)
        seen = 0
        for chunk in stream:
            seen += bool(chunk.choices and chunk.choices[0].delta.content)
            if seen == 3:
                break
        stream.close()
        # Without cancellation this reply would run to its 400 tokens and finish as "length".
        poll(lambda: server.finished and not server.queue.busy, what="the cancelled reply to end")
        assert list(server.finished) == ["cancelled"]
        after = client.chat.completions.create(model=model, messages=LONG, temperature=0, max_tokens=4)
        assert after.choices[0].finish_reason == "length" and after.usage.completion_tokens == 4
        assert list(server.finished) == ["cancelled", "length"]
