"""The chat app over the remote backend: a prompt typed in the TUI streams back from `parley serve`, the status
bar shows client-measured figures, regenerate asks again, Esc stops the server's generation, and the API key
never lands in the history database, an export or the server's log."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, send, wait_until
from serve_support import real_engine, running_server

from parley.engine.events import TextDelta
from parley.engine.params import GenerationParams
from parley.engine.remote import RemoteEngine

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

KEY = "sk-remote-secret-41d2"
QUESTION = "What is the capital of France?"


async def test_tui_chats_with_a_remote_engine(tmp_path):
    params = GenerationParams(temperature=0.0, max_new_tokens=16)
    expected = "".join(e.text for e in real_engine().session().reply(
        [{"role": "user", "content": QUESTION}], GenerationParams(temperature=0.0, max_new_tokens=16))
        if isinstance(e, TextDelta))
    with running_server(api_key=KEY) as (server, url):
        remote = RemoteEngine.connect(url, api_key=KEY)
        app, _ = make_app(tmp_path, load=lambda progress: remote, params=params)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(app, pilot)
            await send(app, pilot, QUESTION)
            await wait_until(lambda: len(app.chat.messages) == 2 and not app.generating, timeout=180)
            await pilot.pause()
            reply = app.chat.messages[-1]
            assert (reply.role, reply.content) == ("assistant", expected)
            stats = app.status.stats
            assert stats is not None and stats.new_tokens > 0 and stats.tokens_per_s > 0
            await pilot.press("ctrl+r")  # regenerate: greedy again, so the same reply
            await wait_until(lambda: len(server.finished) == 2 and not app.generating, timeout=180)
            await pilot.pause()
            assert [m.content for m in app.chat.messages] == [QUESTION, expected]
            path = app.conversations.export(app.conversation.id)

            params.max_new_tokens = 400
            await send(app, pilot, "Now tell me a long story about Paris.")
            await wait_until(lambda: len(app.chat.messages) == 4 and app.chat.messages[-1].content, timeout=180)
            await pilot.press("escape")
            await wait_until(lambda: not app.generating, timeout=60)
            # Esc closed the stream: the server stops long before its 400 tokens.
            await wait_until(lambda: len(server.finished) == 3 and not server.queue.busy, timeout=180)
        first, again, stopped = server.finished
        assert first == again and first in ("stop", "length") and stopped == "cancelled"
        assert not any(KEY in line for line in server.logged)
    assert expected in path.read_text()
    for file in tmp_path.rglob("*"):  # the history database, the export, anything else written
        if file.is_file():
            assert KEY.encode() not in file.read_bytes(), file
    assert KEY not in repr(remote)
