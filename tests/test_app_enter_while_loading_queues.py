"""Enter while the model loads sends the message as soon as it is in: the message shows at once, the reply
comes after the load, and a second message meanwhile is refused with a short notice (the first waits)."""

from __future__ import annotations

import threading

import pytest
from app_support import make_app, notices, send, wait_until
from fake_engine import FakeEngine, loader

pytestmark = pytest.mark.anyio


async def test_a_message_sent_while_loading_is_answered_after_the_load(tmp_path):
    gate = threading.Event()
    engine = FakeEngine(replies=["Hello there."])
    app, _ = make_app(tmp_path, engine, load=loader(engine, block=gate))
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(lambda: app.prompt.is_mounted)
            assert app.engine is None
            await send(app, pilot, "hi, are you there?")
            await wait_until(lambda: [m.content for m in app.chat.messages] == ["hi, are you there?"])
            assert app.prompt.text == "" and not engine.calls
            assert await notices(app, "Queued")
            await send(app, pilot, "second")
            await wait_until(lambda: any("already waits" in str(n.message) for n in app._notifications))
            assert app.prompt.text == "second"  # not lost: still in the prompt
            gate.set()
            await wait_until(lambda: engine.calls and not app.generating and len(app.chat.messages) == 2)
            assert engine.calls[0].messages == [{"role": "user", "content": "hi, are you there?"}]
            assert app.chat.messages[-1].content == "Hello there."
    finally:
        gate.set()
