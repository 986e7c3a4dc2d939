"""Speculation you can see: the drafter is named, acceptance updates while the reply runs, and an
optional view (off by default) highlights the characters that came from accepted drafts."""

from __future__ import annotations

import pytest
from app_support import make_app, notices, ready, send, wait_until
from fake_engine import FakeEngine, split_tokens

pytestmark = pytest.mark.anyio

REPLY = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"


async def test_status_names_the_drafter_and_updates_acceptance_mid_reply(tmp_path):
    engine = FakeEngine(replies=[REPLY], stats_every=4, hold_at=9)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(160, 30)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "go")
        await wait_until(lambda: engine.holding.is_set() and app.status.stats is not None
                         and app.status.stats.new_tokens == 8)
        assert app.generating  # figures from the engine while the reply is still running
        assert "speculating: prompt lookup · 75% of guesses kept · 2.4 tokens per step" in str(app.status.render())
        engine.release.set()
        await wait_until(lambda: not app.generating)
        assert app.status.stats.new_tokens == len(split_tokens(REPLY))


async def test_drafted_characters_are_highlighted_only_when_asked(tmp_path):
    engine = FakeEngine(replies=[REPLY], drafted=True)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "go")
        await wait_until(lambda: engine.calls and not app.generating)
        reply = app.chat.messages[-1]
        tokens = split_tokens(REPLY)
        starts = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        assert reply.drafted == [(starts[i], starts[i] + len(tokens[i])) for i in range(1, len(tokens), 2)]
        view = reply.query_one(".message--drafts")
        assert not view.display and reply.body.display  # off by default: the Markdown view
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert view.display and not reply.body.display
        # Why the reply looks raw is said where it shows (the toggle persists across restarts).
        note = reply.query_one(".message--drafts-note")
        assert note.display and "Ctrl+T" in str(note.render())
        text = reply.drafts_text()  # what the view shows: the reply, drafted characters highlighted
        assert [(s.start, s.end) for s in text.spans] == reply.drafted and text.plain == REPLY
        assert REPLY.split()[1] in app.export_screenshot()
        assert app.settings.get("show_drafts") is True  # kept for the next start
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert not view.display and reply.body.display and not note.display


async def test_engine_notices_are_shown(tmp_path):
    note = "temperature=-1 rejected: expected between 0 and 10; kept 0.7"
    engine = FakeEngine(replies=[REPLY], notices={3: note})
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "go")
        await wait_until(lambda: engine.calls and not app.generating)
        await pilot.pause()
        assert (await notices(app, note)).count(note) == 1
