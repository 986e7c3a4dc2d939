"""The status bar fits an 80-column terminal in every state (a first run quantizing in the background while a
reply streams with speculation, a long prefill): the rate, the context meter, speculation and the model stay,
in short forms; Ctrl+F (and the tooltip) show the rest in full. A speculation note is said once per reply, however
often auto pauses and resumes (each pause's note carries its own figures)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from app_support import make_app, notices, ready, send, wait_until
from fake_engine import FakeEngine, FakeSession

from parley.models.progress import Progress

pytestmark = pytest.mark.anyio

MODEL = "SmolLM2-135M-Instruct (embedded)"


class PausingSession(FakeSession):
    """Every Stats says speculation paused, with other figures each time (as auto's notes do)."""

    counter = itertools.count()

    def _stats(self, n, prompt_tokens, params):
        return dataclasses.replace(super()._stats(n, prompt_tokens, params), speculation_note=(
            f"speculation paused: guesses were too rarely right to pay ({next(self.counter) / 10:.1f} per pass)"))


async def test_every_state_fits_80_columns_and_ctrl_f_has_the_rest(tmp_path):
    engine = FakeEngine(replies=["one two three four five six seven eight nine ten"] * 2, model_name=MODEL,
                        quantization="none", stats_every=2, hold_at=5)
    engine.session = lambda system_prompt=None: PausingSession(engine, system_prompt)

    def upgrade(progress):
        progress(Progress("quantize", 12, 30, "layer"))

    app, _ = make_app(tmp_path, engine, upgrade_engine=upgrade)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "go")
        await wait_until(lambda: engine.holding.is_set() and app.status.stats is not None)
        await wait_until(lambda: "making INT4" in app.status.background)
        await pilot.pause()
        line = str(app.status.render())
        assert len(line) <= app.status.content_size.width, line
        for kept in ("● 42.5 tok/s", "ctx ▰", "spec paused", "INT4 12/30", "SmolLM2-135M-Instruct"):
            assert kept in line, (kept, line)
        assert "…" not in line, line
        engine.release.set()
        await wait_until(lambda: not app.generating)
        await send(app, pilot, "again")
        await wait_until(lambda: len(engine.calls) == 2 and not app.generating)
        said = await notices(app, "speculation paused")
        assert len(said) == 2, said  # once per reply, not once per pause

        await pilot.press("ctrl+f")
        await pilot.pause()
        assert app.status.expanded
        await wait_until(lambda: app.status.size.height > 1)
        full = str(app.status.render())
        for whole in ("making INT4: layer 12 of 30", "context: ", "kept for the reply",
                      f"model: {MODEL} · full precision", "speculating: prompt lookup (paused)"):
            assert whole in full, (whole, full)
        assert "context: " in str(app.status.tooltip)
        await pilot.press("ctrl+f")
        await pilot.pause()
        assert app.status.size.height == 1
