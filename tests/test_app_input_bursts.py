"""No input lost: 100 keys sent without pauses (newlines included) arrive in every field, in order."""

from __future__ import annotations

import random

import pytest
from app_support import burst, make_app, on_screen, ready, wait_until
from textual.widgets import Input, TextArea

from parley.app.screens.dialogs import OpenFileScreen, SystemPromptScreen
from parley.app.screens.history import HistoryScreen

pytestmark = pytest.mark.anyio

SEED = 1234


def typed(rng: random.Random, n: int, alphabet: str, newline: str | None = None) -> tuple[list[str], str]:
    """n keys drawn from `alphabet` (and the `newline` key about one in eight), and the text they make."""
    keys, text = [], ""
    for _ in range(n):
        if newline and rng.random() < 0.125:
            keys.append(newline)
            text += "\n"
        else:
            c = rng.choice(alphabet)
            keys.append("space" if c == " " else c)
            text += c
    return keys, text


async def expect_text(get, expected: str) -> None:
    try:
        await wait_until(lambda: get() == expected, timeout=10)
    except AssertionError:
        raise AssertionError(f"seed {SEED}: expected {expected!r}, got {get()!r}") from None


async def test_prompt_burst_with_newlines_arrives_in_order(tmp_path):
    rng = random.Random(SEED)
    app, engine = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        app.prompt.focus()
        keys, text = typed(rng, 100, "abcdefghij klmnop", newline="ctrl+j")
        burst(app, keys)
        await expect_text(lambda: app.prompt.text, text)
        # ... and is what gets sent.
        burst(app, ["enter"])
        await wait_until(lambda: engine.calls and not app.generating)
        assert engine.calls[0].messages[-1]["content"] == text.strip()


@pytest.mark.parametrize("field", ["seed", "max-tokens"])
async def test_panel_input_burst_arrives_and_sets_the_param(tmp_path, field):
    rng = random.Random(SEED)
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await pilot.press("f2")
        box = app.query_one(f"#{field}", Input)
        box.focus()
        box.value = ""
        await pilot.pause()
        keys, text = typed(rng, 100, "123456789")
        burst(app, keys)
        await expect_text(lambda: box.value, text)
        attr = "seed" if field == "seed" else "max_new_tokens"
        await wait_until(lambda: getattr(app.params, attr) == int(text))


async def test_dialog_fields_take_a_burst(tmp_path):
    rng = random.Random(SEED)
    app, engine = make_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        # System prompt (a TextArea: newlines included).
        await pilot.press("f4")
        await on_screen(app, SystemPromptScreen)
        area = app.screen.query_one("#system-text", TextArea)
        keys, text = typed(rng, 100, "abcdef ghij", newline="enter")
        burst(app, keys)
        await expect_text(lambda: area.text, text)
        await pilot.press("escape")
        # Open file path.
        await pilot.press("ctrl+o")
        await on_screen(app, OpenFileScreen)
        path_box = app.screen.query_one("#open-file-path", Input)
        keys, text = typed(rng, 100, "abcdefgh/._-")
        burst(app, keys)
        await expect_text(lambda: path_box.value, text)
        await pilot.press("escape")
        # History search.
        app.prompt.load_text("hello")
        await pilot.press("enter")
        await wait_until(lambda: engine.calls and not app.generating)
        await pilot.press("f3")
        await on_screen(app, HistoryScreen)
        await pilot.press("slash")
        search = app.screen.query_one("#history-search", Input)
        keys, text = typed(rng, 100, "abcdefgh xyz")
        burst(app, keys)
        await expect_text(lambda: search.value, text)
        # History rename.
        await pilot.press("escape")  # back to the list
        search.value = ""
        await pilot.press("r")
        rename = app.screen.query_one("#history-rename", Input)
        await wait_until(lambda: rename.has_focus)
        rename.value = ""
        keys, text = typed(rng, 100, "abcdefgh XYZ")
        burst(app, keys)
        await expect_text(lambda: rename.value, text)


async def test_keys_right_after_f2_move_the_slider(tmp_path):
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        burst(app, ["f2", "right", "right"])  # no pause for the panel to open
        await wait_until(lambda: app.params.temperature == 0.8)
        assert app.prompt.text == ""
