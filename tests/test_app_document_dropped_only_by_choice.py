"""A follow-up that would push a document out of the window asks first: keep it (a shorter reply, this reply
only), send without it (its label then says the model no longer sees it), or edit the question. Before, the
document was dropped with a passing toast while its label still looked attached, and the answer was invented.
The status bar's meter shows how full the window is; its tooltip says of what."""

from __future__ import annotations

import pytest
from app_support import make_app, on_screen, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app import paste_budget
from parley.app.screens.dialogs import DocumentWontFitScreen
from parley.app.widgets.status_bar import context_meter

pytestmark = pytest.mark.anyio

DOCUMENT = " ".join(f"fact{i}" for i in range(180))


def label(app) -> str:
    return str(app.chat.messages[0].query_one(".message--attachment").render())


async def test_a_document_goes_only_when_the_user_says_so(tmp_path):
    engine = FakeEngine(replies=["Short answer."], context_window=300)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(100, 36)) as pilot:
        await ready(app, pilot)
        await app.attachments.attach_text(DOCUMENT, name="gpl-3.txt")
        await wait_until(lambda: app.attachment.tokens is not None)
        await send(app, pilot, "Summarise.")
        await wait_until(lambda: len(engine.calls) == 1 and not app.generating)
        assert app.status.context_documents == engine.count_tokens(DOCUMENT)
        assert "documents 180" in str(app.status.tooltip)

        await send(app, pilot, "And the second point?")
        await on_screen(app, DocumentWontFitScreen)
        assert len(engine.calls) == 1  # nothing sent before the choice
        assert "Keep it: the reply may then be up to 73 tokens" in str(app.screen.query_one("#wont-fit-message")
                                                                      .render())
        await pilot.press("s")
        await wait_until(lambda: len(engine.calls) == 2 and not app.generating)
        assert engine.calls[1].messages[0]["content"].startswith(DOCUMENT)
        assert {p.max_new_tokens for p in engine.calls[1].snapshots} == {73}
        assert app.params.max_new_tokens == 512  # the slider keeps the user's value
        assert "left out" not in label(app)

        await send(app, pilot, "A third question?")
        await on_screen(app, DocumentWontFitScreen)
        await pilot.press("escape")  # edit the question: it is back in the prompt, nothing sent
        await wait_until(lambda: app.prompt.text == "A third question?")
        assert len(engine.calls) == 2 and len(app.chat.messages) == 4

        await send(app, pilot, "A third question?")
        await on_screen(app, DocumentWontFitScreen)
        await pilot.press("l")
        await wait_until(lambda: len(engine.calls) == 3 and not app.generating)
        assert all(DOCUMENT not in m["content"] for m in engine.calls[2].messages)
        assert label(app).endswith("left out: the model no longer sees it")
        assert app.status.context_documents == 0

        await send(app, pilot, "And a fourth?")  # chosen once: not asked again
        await wait_until(lambda: len(engine.calls) == 4 and not app.generating)


def test_the_reply_room_that_keeps_the_documents():
    roles = ["user", "assistant"] * 3
    counts = [150, 10, 20, 10, 5]  # a document in the first exchange, a plain one, the question
    # The plain exchange goes; the document, its answer and the question stay, with their framing.
    assert paste_budget.reply_room(counts, roles[:5], {0}, 300, 0) == 300 - 165 - 8 * 5


def test_the_meter_is_documents_then_chat_then_the_reply():
    meter = context_meter(800, 400, 200, 100, cells=8)
    assert meter.plain == "ctx ▰▰▰▰▰▱▱▱ 50%"
    assert [meter.plain[s.start:s.end] for s in meter.spans if s.style != "dim"][:3] == ["▰▰", "▰▰", "▰"]
    assert "red" in str(context_meter(800, 760, 0, 100).spans[-1].style)  # the reply would not fit
