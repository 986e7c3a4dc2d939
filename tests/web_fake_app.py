"""The chat app over the fake engine, as a program: what `parley web` serves in the browser test.

Its database and settings go under $PARLEY_WEB_TEST_DIR, where the test reads what happened. With
$PARLEY_WEB_TEST_BUSY set, a background "INT4 quantization" runs and never finishes (work that must not keep
the process alive once its tab is gone); the app writes its pid to $PARLEY_WEB_TEST_DIR/pids/.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeEngine, loader  # noqa: E402

from parley.app.chat_app import ParleyApp  # noqa: E402
from parley.app.settings import Settings  # noqa: E402
from parley.app.store import Store  # noqa: E402

ANSWER = "The capital of France is Paris, a city on the Seine."

if __name__ == "__main__":
    folder = Path(os.environ["PARLEY_WEB_TEST_DIR"])
    engine = FakeEngine(replies=[ANSWER], delay=0.05)
    upgrade = None
    if os.environ.get("PARLEY_WEB_TEST_BUSY"):
        (folder / "pids").mkdir(exist_ok=True)
        (folder / "pids" / str(os.getpid())).touch()
        upgrade = lambda progress: threading.Event().wait()  # noqa: E731
    app = ParleyApp(loader(engine), upgrade_engine=upgrade, store=Store(folder / "parley.db"),
                    settings=Settings(folder / "settings.json"), export_dir=folder)
    app.run()
