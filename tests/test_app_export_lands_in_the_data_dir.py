"""An export goes to Parley's data folder (exports/), not wherever the app was started (a git clone, say),
and the notice says where."""

import pytest
from app_support import notices, ready, send, wait_until
from fake_engine import FakeEngine, loader

from parley.app.chat_app import ParleyApp
from parley.app.settings import Settings
from parley.app.store import Store

pytestmark = pytest.mark.anyio


async def test_export_goes_to_the_data_dir(tmp_path, monkeypatch):
    data, started_in = tmp_path / "data", tmp_path / "clone"
    started_in.mkdir()
    monkeypatch.setenv("PARLEY_DATA_DIR", str(data))
    monkeypatch.chdir(started_in)
    engine = FakeEngine(replies=["Paris."])
    app = ParleyApp(loader(engine), store=Store(tmp_path / "parley.db"), settings=Settings(tmp_path / "s.json"))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "France?")
        await wait_until(lambda: engine.calls and not app.generating)
        await pilot.press("f9")
        path = data / "exports" / f"france-{app.conversation.id}.md"
        await wait_until(path.is_file)
        assert list(started_in.iterdir()) == []
        assert await notices(app, f"Exported to {path}")
