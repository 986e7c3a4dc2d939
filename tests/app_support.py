"""Helpers for the UI tests: build the app over the fake engine, and poll instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from fake_engine import FakeEngine, loader

from parley.app.chat_app import ParleyApp
from parley.app.settings import Settings
from parley.app.store import Store


async def wait_until(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.01) -> None:
    """Yield to the app until `predicate()` is true; fail with the predicate's source after `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        await asyncio.sleep(interval)


async def notices(app, text: str) -> list[str]:
    """The notifications that contain `text`, once there is one: `App.notify` posts a message, so a notice
    shows up a moment after the code that sent it has run (asserting at once raced it under load)."""
    await wait_until(lambda: any(text in str(n.message) for n in app._notifications))
    return [str(n.message) for n in app._notifications if text in str(n.message)]


def make_app(tmp_path: Path, engine: FakeEngine | None = None, *, app_class: type[ParleyApp] = ParleyApp,
             **kwargs) -> tuple[ParleyApp, FakeEngine]:
    """A ParleyApp on the fake engine with its database, settings and exports under `tmp_path`."""
    engine = engine or FakeEngine()
    load = kwargs.pop("load", None) or loader(engine)
    store = kwargs.pop("store", None) or Store(tmp_path / "parley.db")
    settings = kwargs.pop("settings", None) or Settings(tmp_path / "settings.json")
    app = app_class(load, store=store, settings=settings, export_dir=tmp_path, **kwargs)
    return app, engine


async def ready(app: ParleyApp, pilot) -> None:
    """Wait for the engine to load and the chat screen to show."""
    await wait_until(lambda: app.engine is not None and app.engines.loading is None)
    await pilot.pause()


async def send(app: ParleyApp, pilot, text: str) -> None:
    app.prompt.focus()
    app.prompt.load_text(text)
    await pilot.press("enter")


def key_event(key: str):
    """The Key event a terminal would send for `key` ('a', 'ctrl+j', 'space', ...), as Pilot builds it."""
    import unicodedata

    from textual import events
    from textual.app import _character_to_key
    from textual.keys import REPLACED_KEYS, _get_unicode_name_from_key

    if len(key) == 1 and not key.isalnum():
        key = _character_to_key(key)
    try:
        char = unicodedata.lookup(_get_unicode_name_from_key(REPLACED_KEYS.get(key, key)))
    except KeyError:
        char = key if len(key) == 1 else None
    return events.Key(key, char)


def burst(app: ParleyApp, keys: list[str]) -> None:
    """Send `keys` as one burst, with no pause between them (a fast typist, or a terminal's paste
    without bracketed-paste mode): all are queued before the app handles the first."""
    for key in keys:
        event = key_event(key)
        event.set_sender(app)
        app._driver.send_message(event)


async def on_screen(app: ParleyApp, screen_class: type) -> None:
    """Wait until a `screen_class` screen is on top with its widgets mounted (they mount after the
    screen itself, so querying them right after the push can race)."""
    await wait_until(lambda: isinstance(app.screen, screen_class) and app.screen.is_mounted
                     and app.screen.children)
