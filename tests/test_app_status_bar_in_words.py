"""The status bar in words: the quantization ("INT4 (AWQ)", "full precision", never "· none"), speculation
("speculating: prompt lookup · 75% of guesses kept · 2.4 tokens per step"), and the background INT4 progress
kept whole in an ordinary 100-column terminal (it used to be cut below 220 columns). A note the engine sends
when auto paused speculation is shown once, and the drafter reads "(paused)" while it is."""

from __future__ import annotations

import dataclasses

import pytest
from app_support import make_app, notices, ready, send, wait_until
from fake_engine import FakeEngine, FakeSession

from parley.app.widgets.status_bar import quantization_words
from parley.engine.events import Stats
from parley.models.progress import Progress

pytestmark = pytest.mark.anyio


def test_quantization_words():
    assert quantization_words("awq-int4") == "INT4 (AWQ)"
    assert quantization_words("gptq-int4") == "INT4 (GPTQ)"
    assert quantization_words("none") == "full precision"


async def test_int4_progress_and_the_model_stay_whole_at_100_columns(tmp_path):
    engine = FakeEngine(model_name="SmolLM2-135M-Instruct", quantization="none")

    def upgrade(progress):
        progress(Progress("quantize", 12, 30, "layer"))

    app, _ = make_app(tmp_path, engine, upgrade_engine=upgrade)
    async with app.run_test(size=(100, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "hi")
        await wait_until(lambda: engine.calls and not app.generating and app.status.stats is not None)
        line = str(app.status.render())
        assert "INT4 12/30" in line  # in short, beside the figures; in full in the details (Ctrl+F)
        assert "making INT4: layer 12 of 30" in app.status.details()
        assert line.endswith("SmolLM2-135M-Instruct · full precision")
        assert "none" not in line


class NotingSession(FakeSession):
    def _stats(self, n, prompt_tokens, params):
        stats = super()._stats(n, prompt_tokens, params)
        fields = {f.name for f in dataclasses.fields(Stats)}
        note = "speculation paused: prompt lookup was slowing this reply down"
        if "speculation_note" in fields:
            return dataclasses.replace(stats, speculation_note=note)
        stats = dataclasses.replace(stats)
        object.__setattr__(stats, "speculation_note", note)  # before the engine's field is merged
        return stats


async def test_speculation_in_words_and_its_note_shown_once(tmp_path):
    engine = FakeEngine(replies=["one two three four five six seven eight nine ten"], stats_every=2)
    engine.session = lambda system_prompt=None: NotingSession(engine, system_prompt)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(160, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "go")
        await wait_until(lambda: engine.calls and not app.generating)
        stats = app.status.stats
        assert (f"speculating: prompt lookup (paused) · {stats.accepted / stats.proposed:.0%} of guesses kept · "
                "2.4 tokens per step") in str(app.status.render())
        notes = await notices(app, "slowing this reply down")
        assert len(notes) == 1
