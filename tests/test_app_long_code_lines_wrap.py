"""A code line wider than the chat wraps inside its block instead of being cut at the right edge."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine
from textual.widgets._markdown import MarkdownFence

pytestmark = pytest.mark.anyio

TAIL = "END_OF_THE_LONG_LINE"
LONG = "x = [" + ", ".join(str(i) for i in range(60)) + f"]  # {TAIL}"


async def test_long_code_line_is_fully_visible(tmp_path):
    engine = FakeEngine(replies=[f"```python\n{LONG}\n```"])
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(80, 30)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "a long line")
        await wait_until(lambda: engine.calls and not app.generating)
        await pilot.pause()
        fence = app.chat.messages[-1].query_one(MarkdownFence)
        assert fence.size.width < len(LONG)  # the line really is wider than the block
        assert TAIL in app.export_screenshot()  # its end is on screen, not cut at the right edge
