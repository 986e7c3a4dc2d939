"""Settings have one store, settings.json: a database from before keeps its settings rows there (a value
settings.json already holds wins) and loses the table."""

from __future__ import annotations

import json
import sqlite3

from parley.app.settings import Settings
from parley.app.store import MIGRATIONS, Store


def test_old_settings_rows_move_into_settings_json(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_CONFIG_DIR", str(tmp_path / "config"))
    kept = Settings()
    kept.set("theme", "gruvbox")  # the app already wrote this one: it wins
    path = tmp_path / "p.db"
    db = sqlite3.connect(path)
    db.executescript(";".join(MIGRATIONS[:3]) + "; PRAGMA user_version = 3;")
    db.executemany("INSERT INTO settings (key, value) VALUES (?, ?)", [("theme", "nord"), ("sidebar", "left")])
    db.commit()
    db.close()

    store = Store(path)
    assert store.problem is None and store.version == len(MIGRATIONS)
    assert json.loads(Settings().path.read_text()) == {"theme": "gruvbox", "sidebar": "left"}
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "settings" not in tables and {"conversations", "messages"} <= tables


def test_a_new_database_writes_no_settings_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_CONFIG_DIR", str(tmp_path / "config"))
    Store(tmp_path / "p.db")
    assert not Settings().path.exists()
