"""A reply's single newlines (a poem, a plain list) show as line breaks, while streaming and once finished; a
code block below is shown as it was written."""

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine
from textual.widgets._markdown import MarkdownFence, MarkdownParagraph

pytestmark = pytest.mark.anyio

POEM = "Roses are red,\nviolets are blue,\nsugar is sweet."
CODE = "def f():\n    return 1"


def shown(app, kind) -> list[str]:
    body = app.chat.messages[-1].body
    return [str(block._content) if kind is MarkdownParagraph else block.code for block in body.query(kind)]


async def test_single_newlines_are_line_breaks(tmp_path):
    engine = FakeEngine(replies=[f"{POEM}\n\n```python\n{CODE}\n```\n\nThe end\nof it."], hold_at=6)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(100, 40)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "A poem?")
        await wait_until(engine.holding.is_set)
        await wait_until(lambda: shown(app, MarkdownParagraph) and "\n" in shown(app, MarkdownParagraph)[0])
        assert shown(app, MarkdownParagraph)[0].startswith("Roses are red,\nviolets")  # while streaming
        engine.release.set()
        await wait_until(lambda: not app.generating)
        await pilot.pause()
        assert shown(app, MarkdownParagraph) == [POEM, "The end\nof it."]
        assert shown(app, MarkdownFence) == [CODE]
