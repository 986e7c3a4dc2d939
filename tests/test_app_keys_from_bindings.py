"""The help screen and the command palette are generated from the bindings, and every key they list
works from the prompt (no key is shadowed by the prompt's own text-editing keys)."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, wait_until
from textual.binding import Binding
from textual.command import CommandPalette

from parley.app.chat_app import ParleyApp
from parley.app.commands import key_label, palette_entries
from parley.app.screens.chat import ChatScreen
from parley.app.screens.help import HelpScreen, key_rows
from parley.app.widgets.prompt import PromptInput

pytestmark = pytest.mark.anyio

APP_BINDINGS = list(Binding.make_bindings([*ChatScreen.BINDINGS, *ParleyApp.BINDINGS]))


def test_every_app_binding_says_what_it_does_and_is_in_the_palette():
    assert all(b.tooltip for b in APP_BINDINGS)
    entries = palette_entries(APP_BINDINGS)
    assert [action for _, _, action in entries] == [b.action for b in APP_BINDINGS]
    assert ("Regenerate the last reply", "key: Ctrl+R", "regenerate") in entries


def test_help_lists_every_key_with_its_tooltip():
    rows = key_rows([*APP_BINDINGS, *Binding.make_bindings(PromptInput.BINDINGS)])
    for b in APP_BINDINGS:
        assert (b.key_display or key_label(b), b.tooltip) in rows
    assert ("Shift+Enter, Ctrl+J", "New line") in rows  # one row for the keys of one action


def test_no_app_key_is_taken_by_the_prompt():
    prompt_keys: set[str] = set()
    for cls in PromptInput.__mro__:
        for b in Binding.make_bindings(getattr(cls, "BINDINGS", [])):
            prompt_keys.update(b.key.split(","))
    app_keys = {k for b in APP_BINDINGS for k in b.key.split(",")}
    assert app_keys & prompt_keys == set()


async def test_palette_lists_the_bindings_and_runs_them(tmp_path):
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+p")
        await wait_until(lambda: isinstance(app.screen, CommandPalette))
        await pilot.press(*"show all keys")
        await pilot.pause()
        await pilot.press("down", "enter")
        await wait_until(lambda: isinstance(app.screen, HelpScreen))
