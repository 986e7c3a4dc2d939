"""The chat app as a program that presses a key as soon as it is in a given busy state; for the quit tests.

`python quit_fake_app.py FOLDER STATE KEY`: STATE is `loading` (the model load never returns) or `upgrading`
(INT4 is made in the background and never finishes); KEY is pressed once the app is in that state.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeEngine  # noqa: E402

from parley.app.chat_app import ParleyApp  # noqa: E402
from parley.app.settings import Settings  # noqa: E402
from parley.app.store import Store  # noqa: E402
from parley.models.progress import Progress  # noqa: E402

if __name__ == "__main__":
    folder, state, key = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    never = threading.Event()
    engine = FakeEngine()

    def load(progress):
        if state == "loading":
            never.wait()
        return engine

    def upgrade(progress):
        progress(Progress("quantize", 3, 30, "layer"))
        never.wait()

    app = ParleyApp(load, upgrade_engine=upgrade, store=Store(folder / "parley.db"),
                    settings=Settings(folder / "settings.json"), export_dir=folder)

    def busy() -> bool:
        return app.engine is None if state == "loading" else "INT4" in app.status.background

    async def press_when_busy() -> None:
        if not busy():
            app.set_timer(0.05, press_when_busy)
            return
        print("busy", flush=True)
        await app._press_keys([key])

    app.call_later(press_when_busy)
    app.run(headless=True, size=(100, 30))
    print("exited", flush=True)
