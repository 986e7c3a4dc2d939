"""A large paste becomes an attachment; summarise is one key; too long for the context asks first."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, wait_until
from fake_engine import FakeEngine
from textual import events

from parley.app.attachments import SUMMARISE_PROMPT
from parley.app.paste_budget import budget, fit_text
from parley.app.screens.dialogs import TooLongScreen

pytestmark = pytest.mark.anyio

DOC = "\n".join(f"line {i} of the report" for i in range(1, 215))  # 214 lines


async def paste_document(app) -> None:
    app.prompt.focus()
    app.post_message(events.Paste(DOC))
    await wait_until(lambda: app.attachment is not None and app.attachment.tokens is not None)


async def test_large_paste_becomes_attachment_and_is_sent_with_the_question(tmp_path):
    app, engine = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await paste_document(app)
        assert app.prompt.text == ""  # the input is not flooded
        label = str(app.query_one("#attachment-label").render())
        assert label == f"pasted: 214 lines, {engine.count_tokens(DOC):,} tokens"
        await pilot.press("w", "h", "a", "t", "?", "enter")
        await wait_until(lambda: engine.calls and not app.generating)
        assert engine.calls[0].messages == [{"role": "user", "content": DOC + "\n\nwhat?"}]
        assert app.attachment is None
        user = app.chat.messages[0]
        assert user.content == "what?" and user.attachment == DOC
        assert app.store.messages(app.conversation.id)[0].attachment == DOC


async def test_small_paste_goes_into_the_prompt(tmp_path):
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        app.prompt.focus()
        app.post_message(events.Paste("just a line"))
        await pilot.pause()
        assert app.prompt.text == "just a line" and app.attachment is None


async def test_summarise_is_one_key(tmp_path):
    app, engine = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await paste_document(app)
        await pilot.press("ctrl+s")
        await wait_until(lambda: engine.calls and not app.generating)
        assert engine.calls[0].messages[0]["content"] == DOC + "\n\n" + SUMMARISE_PROMPT


@pytest.mark.parametrize("choice", ["truncate", "cancel"])
async def test_paste_over_the_context_window_asks(tmp_path, choice):
    engine = FakeEngine(context_window=400)  # 214 lines * 5 pieces > 400 - 100 kept for the reply
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        app.prompt.focus()
        app.post_message(events.Paste(DOC))
        await wait_until(lambda: isinstance(app.screen, TooLongScreen) and app.screen.query("#too-long-message"))
        message = str(app.screen.query_one("#too-long-message").render())
        free = budget(400, 0, 0, app.params.max_new_tokens).free  # 400 - 100 for the reply - the framing
        assert f"It is {engine.count_tokens(DOC):,} tokens, but only {free} fit" in message
        assert "of 214 lines" in message
        assert app.attachment.tokens is None  # nothing can be sent until the user chooses
        await pilot.press("t" if choice == "truncate" else "escape")
        await pilot.pause()
        if choice == "cancel":
            assert app.attachment is None
        else:
            chip = app.attachment
            assert chip.tokens <= free and DOC.startswith(chip.text) and chip.text.endswith("of the report")


def test_fit_text_keeps_whole_lines_when_it_can():
    count = lambda t: len(t.split())
    text = "a b c\nd e f\ng h i"
    assert fit_text(count, text, 6) == ("a b c\nd e f", 6)
    assert fit_text(count, text, 2) == ("a b ", 2)  # the first line alone is too long: cut inside it
    assert fit_text(count, text, 100) == (text, 9)
