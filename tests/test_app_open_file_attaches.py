"""A file opened by path (Ctrl+O, as llama-cli's /read) becomes the attachment; bad paths say why."""

from __future__ import annotations

import pytest
from app_support import make_app, notices, on_screen, ready, wait_until

from parley.app.screens.dialogs import OpenFileScreen

pytestmark = pytest.mark.anyio


async def test_open_file_attaches_it(tmp_path):
    doc = tmp_path / "report.md"
    doc.write_text("first\r\nsecond\r\nthird\r\n", encoding="utf-8")
    app, engine = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+o")
        await on_screen(app, OpenFileScreen)
        app.screen.query_one("#open-file-path").value = str(doc)
        await pilot.press("enter")
        await wait_until(lambda: app.attachment is not None and app.attachment.tokens is not None)
        assert app.attachment.text == "first\nsecond\nthird\n" and app.prompt.has_focus
        # Labelled with the file's name (it used to say "pasted: 4 lines"), above the prompt and in the chat.
        label = str(app.attachment.query_one("#attachment-label").render())
        assert label.startswith("report.md: 4 lines")
        await pilot.press("w", "h", "y", "enter")
        await wait_until(lambda: engine.calls and not app.generating)
        assert engine.calls[0].messages[0]["content"].startswith("first\nsecond\nthird")
        sent = str(app.chat.messages[0].query_one(".message--attachment").render())
        assert sent.startswith("report.md: 4 lines")


@pytest.mark.parametrize("kind", ["missing", "binary"])
async def test_unreadable_file_says_why(tmp_path, kind):
    path = tmp_path / ("nope.txt" if kind == "missing" else "blob.bin")
    if kind == "binary":
        path.write_bytes(b"\xff\xfe\x00\x81" * 10)
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await app.attachments.attach_file(path)
        await pilot.pause()
        assert app.attachment is None
        expected = "not UTF-8 text" if kind == "binary" else "Could not read"
        assert any(str(path) in message for message in await notices(app, expected))
