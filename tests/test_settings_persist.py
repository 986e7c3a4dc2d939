"""Settings survive a restart (atomically written), per conversation where it changed them, with a reset."""

from __future__ import annotations

import json

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app import cli
from parley.app.settings import Settings, default_path
from parley.app.widgets.slider import Slider

pytestmark = pytest.mark.anyio


def test_settings_file_roundtrip_and_bad_files(tmp_path):
    path = tmp_path / "cfg" / "settings.json"
    s = Settings(path)
    assert s.problem is None and s.values == {}
    s.set("params", {"temperature": 0.3, "top_k": 5, "speculation": "off"})
    assert not list(path.parent.glob(".settings-*"))  # the temporary file was renamed over
    params = Settings(path).params()
    assert (params.temperature, params.top_k, params.speculation) == (0.3, 5, "off")
    # Out-of-range or mistyped values are left at their defaults, the rest is kept.
    path.write_text(json.dumps({"params": {"temperature": -3, "top_k": "many", "top_p": 0.5}}))
    params = Settings(path).params()
    assert (params.temperature, params.top_k, params.top_p) == (0.7, 0, 0.5)
    # A damaged file: defaults, and a message naming it (never a traceback).
    path.write_text("{not json")
    broken = Settings(path)
    assert broken.values == {} and str(path) in broken.problem


def test_config_dir_can_be_moved(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_CONFIG_DIR", str(tmp_path / "elsewhere"))
    assert default_path() == tmp_path / "elsewhere" / "settings.json"


def test_command_line_flags_win_over_saved_values():
    saved = cli.params_from_args(cli.build_parser().parse_args(["chat", "--top-k", "7"]))
    args = cli.build_parser().parse_args(["chat", "--temperature", "0.2", "--repeat-penalty", "1.3"])
    params = cli.params_from_args(args, base=saved)
    assert (params.temperature, params.top_k, params.repeat_penalty) == (0.2, 7, 1.3)


async def test_slider_values_survive_a_restart_and_reset_restores_defaults(tmp_path):
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await pilot.press("f2", "right", "right")  # temperature 0.70 -> 0.80
        app.query_one("#speculation").value = "off"
        app.query_one("#max-tokens").value = "64"
        await wait_until(lambda: app.params.max_new_tokens == 64 and app.params.speculation == "off")
    app, _ = make_app(tmp_path)  # a new start with the same settings file
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        assert (app.params.temperature, app.params.speculation, app.params.max_new_tokens) == (0.8, "off", 64)
        assert app.query_one("#slider-temperature", Slider).value == 0.8
        await pilot.press("f8")  # reset to defaults
        await pilot.pause()
        assert (app.params.temperature, app.params.speculation, app.params.max_new_tokens) == (0.7, "auto", 512)
        assert app.query_one("#slider-temperature", Slider).value == 0.7
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        assert app.params.temperature == 0.7


async def test_a_conversation_keeps_its_own_values(tmp_path):
    app, engine = make_app(tmp_path, FakeEngine(replies=["A.", "B."]))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "first chat")
        await wait_until(lambda: engine.calls and not app.generating)
        first = app.conversation.id
        await pilot.press("f2", "end")  # temperature 2.0 in this conversation
        await wait_until(lambda: app.params.temperature == 2.0)
        await pilot.press("f2", "ctrl+n")
        await pilot.pause()
        await pilot.press("f2", "home")  # and 0.0 after, in a new chat
        await wait_until(lambda: app.params.temperature == 0.0)
        await pilot.press("f2")
        await app.conversations.resume(first)
        assert app.params.temperature == 2.0  # the resumed conversation's own value
        assert app.query_one("#slider-temperature", Slider).value == 2.0
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.params.temperature == 0.0  # a new chat starts from the last value set
