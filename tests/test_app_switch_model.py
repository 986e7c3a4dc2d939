"""Switch models without restarting (F5 or the command palette): the picker lists the models used lately and
those quantized in the cache, takes a hub id or path, loads it while the chat goes on, and the conversation
carries over; the status bar says which model and quantization are active, in words."""

from __future__ import annotations

import json

import pytest
from app_support import make_app, on_screen, ready, send, wait_until
from fake_engine import FakeEngine
from textual.command import CommandList, CommandPalette
from textual.widgets import OptionList

from parley.app.screens.model_picker import ModelPickerScreen, cached_models

pytestmark = pytest.mark.anyio


async def test_type_a_model_and_the_chat_carries_over(tmp_path):
    first = FakeEngine(replies=["Paris."], model_name="smol")
    other = FakeEngine(replies=["Still Paris."], model_name="gemma-270m", quantization="none")
    asked = []

    def load_model(ref, progress):
        asked.append(ref)
        return other

    app, _ = make_app(tmp_path, first, load_model=load_model)
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "Capital of France?")
        await wait_until(lambda: first.calls and not app.generating)
        await pilot.press("f5")
        await on_screen(app, ModelPickerScreen)
        app.screen.query_one("#model-ref").value = "org/gemma-270m"
        await pilot.press("enter")
        await wait_until(lambda: app.engine is other)
        assert asked == ["org/gemma-270m"]
        assert str(app.status.render()).endswith("gemma-270m · full precision")
        await send(app, pilot, "Sure?")
        await wait_until(lambda: other.calls and not app.generating)
        assert [m["content"] for m in other.calls[0].messages] == ["Capital of France?", "Paris.", "Sure?"]
        assert app.settings.get("recent_models") == ["org/gemma-270m"]
        await pilot.press("f5")  # now offered as used lately
        await on_screen(app, ModelPickerScreen)
        listed = app.screen.query_one("#model-list", OptionList)
        assert "org/gemma-270m  (used lately)" in str(listed.get_option_at_index(0).prompt)


async def test_a_model_that_fails_to_load_leaves_the_chat_on_its_model(tmp_path):
    first = FakeEngine(model_name="smol")

    def load_model(ref, progress):
        raise FileNotFoundError(f"{ref}: no such file")

    app, _ = make_app(tmp_path, first, load_model=load_model)
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        app.engines.switch_model("/nope.gguf")
        await wait_until(lambda: any("Could not load /nope.gguf" in str(n.message) for n in app._notifications))
        assert app.engine is first and app.status.background == ""


def test_cached_models_are_read_from_complete_builds(tmp_path):
    (tmp_path / "smol-awq-g64-1").mkdir()
    (tmp_path / "smol-awq-g64-1" / "manifest.json").write_text(json.dumps({"source": {"repo_id": "org/smol"}}))
    (tmp_path / "half-built").mkdir()  # no manifest: not complete, not offered
    (tmp_path / "bad-awq").mkdir()
    (tmp_path / "bad-awq" / "manifest.json").write_text("{not json")
    assert cached_models(tmp_path) == ["org/smol"]


@pytest.mark.parametrize(("query", "screen"), [("model", ModelPickerScreen), ("speculation", None)])
async def test_the_palette_finds_model_and_speculation(tmp_path, query, screen):
    app, _ = make_app(tmp_path, load_model=lambda ref, progress: FakeEngine())
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+p")
        await wait_until(lambda: isinstance(app.screen, CommandPalette))
        await pilot.press(*query)
        commands = app.screen.query_one(CommandList)
        await wait_until(lambda: commands.option_count > 0 and commands.highlighted == 0)
        assert query in str(commands.get_option_at_index(0).prompt).lower()  # the best match is the one meant
        await pilot.press("enter")
        if screen is not None:
            await on_screen(app, screen)
        else:
            await wait_until(lambda: app.focused is app.panel.query_one("#speculation"))


async def test_focus_starts_where_a_typed_path_goes(tmp_path):
    asked = []
    app, _ = make_app(tmp_path, FakeEngine(model_name="smol"),
                      load_model=lambda ref, progress: asked.append(ref) or FakeEngine(model_name="other"))
    app.settings.set("recent_models", ["org/used-lately"])
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        await pilot.press("f5")
        await on_screen(app, ModelPickerScreen)
        await pilot.press(*"/m.gguf", "enter")
        await wait_until(lambda: asked)
        assert asked == ["/m.gguf"]
        await pilot.press("f5")  # Down leaves the box for the list
        await on_screen(app, ModelPickerScreen)
        await pilot.press("down")
        assert app.focused is app.screen.query_one("#model-list")
