"""A paste with CR or CRLF line endings counts and sends as lines, not as one long line."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, wait_until
from textual import events

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("ending", ["\r", "\r\n"], ids=["cr", "crlf"])
async def test_large_paste_with_cr_endings_is_counted_in_lines(tmp_path, ending):
    doc = ending.join(f"row {i}" for i in range(30))
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        app.prompt.focus()
        app.post_message(events.Paste(doc))
        await wait_until(lambda: app.attachment is not None and app.attachment.tokens is not None)
        assert str(app.query_one("#attachment-label").render()).startswith("pasted: 30 lines,")
        assert "\r" not in app.attachment.text


async def test_small_paste_with_cr_endings_goes_in_as_lines(tmp_path):
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        app.prompt.focus()
        app.post_message(events.Paste("one\rtwo\r\nthree"))
        await wait_until(lambda: app.prompt.text)
        assert app.prompt.text == "one\ntwo\nthree" and app.prompt.document.line_count == 3
