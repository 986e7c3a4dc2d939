"""A long prompt shows how far the model has read it and about how long is left (once it has taken over a
second), and Esc cancels it at once: nothing shown, the question kept, the next message answered."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine

pytestmark = pytest.mark.anyio


async def test_progress_while_reading_then_esc_cancels(tmp_path):
    engine = FakeEngine(replies=["never shown", "Short answer."], prefill_tokens=2048, delay=0.3)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "a very long question")
        await wait_until(engine.holding.is_set)  # 512 of 2,048 read, and still reading
        await wait_until(lambda: "reading the prompt 25%" in str(app.status.render()))
        line = str(app.status.render())
        assert "left" in line and "Esc cancels" in line
        await pilot.press("escape")
        assert not app.generating and "reading the prompt" not in str(app.status.render())
        await wait_until(lambda: engine.calls[0].reason == "cancelled")
        assert [m.content for m in app.chat.messages] == ["a very long question"]
        engine.prefill_tokens = 0
        await send(app, pilot, "and now?")
        await wait_until(lambda: len(engine.calls) == 2 and not app.generating)
        assert app.chat.messages[-1].content == "Short answer."
