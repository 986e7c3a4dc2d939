"""The status bar says when the reply shares the engine with others (Stats.batch: replies in the same passes,
e.g. another `parley web` tab on the same server): in words on a wide terminal, shorter as the terminal narrows
(80 columns keep "×3"), in full in the details; nothing when the reply has the engine to itself."""

from __future__ import annotations

import dataclasses

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine, FakeSession

from parley.app.widgets.status_bar import sharing_words

pytestmark = pytest.mark.anyio


class SharedSession(FakeSession):
    batch = 3

    def _stats(self, n, prompt_tokens, params):
        return dataclasses.replace(super()._stats(n, prompt_tokens, params), batch=self.batch)


def test_sharing_in_words():
    assert sharing_words(1) == "" and sharing_words(3) == "sharing the engine: 3 replies at once"
    assert sharing_words(3, compact=1) == "shared ×3" and sharing_words(3, compact=3) == "×3"


@pytest.mark.parametrize("width, words", [(200, "sharing the engine: 3 replies at once"), (80, "×3")])
async def test_a_shared_reply_says_so(tmp_path, width, words):
    engine = FakeEngine(replies=["one two three four five six"])
    engine.session = lambda system_prompt=None: SharedSession(engine, system_prompt)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(width, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "go")
        await wait_until(lambda: engine.calls and not app.generating and app.status.stats is not None)
        line = str(app.status.render())
        assert words in line and len(line.splitlines()[0]) <= width
        assert "sharing the engine: 3 replies at once" in app.status.details()


async def test_a_reply_alone_says_nothing_of_sharing(tmp_path):
    engine = FakeEngine(replies=["one two three"])
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(160, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "go")
        await wait_until(lambda: engine.calls and not app.generating and app.status.stats is not None)
        assert "shar" not in str(app.status.render()) and "×" not in str(app.status.render())
