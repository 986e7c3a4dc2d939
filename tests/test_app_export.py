"""Export writes the conversation as Markdown."""

from __future__ import annotations

import pytest
from app_support import make_app, notices, ready, send, wait_until
from fake_engine import FakeEngine
from textual import events

pytestmark = pytest.mark.anyio


async def test_export_writes_expected_markdown(tmp_path):
    engine = FakeEngine(replies=["Use `sum`:\n\n```python\nsum([1, 2])\n```", "It is short."])
    app, _ = make_app(tmp_path, engine, system_prompt="Be brief.")
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "Add a list?")
        await wait_until(lambda: len(engine.calls) == 1 and not app.generating)
        app.post_message(events.Paste("x\n" * 30))
        await wait_until(lambda: app.attachment is not None and app.attachment.tokens is not None)
        await send(app, pilot, "And this?")
        await wait_until(lambda: len(engine.calls) == 2 and not app.generating)
        app.chat_screen.action_export()
        path = tmp_path / f"add-a-list-{app.conversation.id}.md"
        assert path.read_text() == (
            "# Add a list?\n\n"
            "**System:** Be brief.\n\n"
            "## User\n\n"
            "Add a list?\n\n"
            "## Assistant\n\n"
            "Use `sum`:\n\n```python\nsum([1, 2])\n```\n\n"
            "## User\n\n"
            "<details><summary>Pasted document</summary>\n\n" + "x\n" * 29 + "x\n\n\n</details>\n\n"
            "And this?\n\n"
            "## Assistant\n\n"
            "It is short.\n"
        )


async def test_export_says_where_it_wrote(tmp_path):
    app, engine = make_app(tmp_path, FakeEngine(replies=["Yes."]))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "Export me?")
        await wait_until(lambda: engine.calls and not app.generating)
        await pilot.press("f9")
        path = (tmp_path / f"export-me-{app.conversation.id}.md").resolve()
        await wait_until(lambda: path.exists())
        assert f"Exported to {path}" in await notices(app, f"Exported to {path}")
        assert path.is_absolute()
