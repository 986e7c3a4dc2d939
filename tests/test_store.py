"""The SQLite store: numbered migrations by PRAGMA user_version, the data dir override, cascades."""

from __future__ import annotations

import sqlite3

from parley.app.store import MIGRATIONS, Store, data_dir


def test_new_database_is_at_latest_version(tmp_path):
    store = Store(tmp_path / "p.db")
    assert store.version == len(MIGRATIONS)


def test_old_database_is_upgraded_in_place(tmp_path):
    path = tmp_path / "p.db"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0] + "PRAGMA user_version = 1;")
    db.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('old', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created_at) VALUES (1, 'user', 'hi', 1)")
    db.commit()
    db.close()
    store = Store(path)
    assert store.version == len(MIGRATIONS)
    [conv] = store.conversations()
    assert conv.title == "old"
    assert store.messages(conv.id)[0].attachment is None


def test_data_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv("PARLEY_DATA_DIR", str(tmp_path / "x"))
    assert data_dir() == tmp_path / "x"
    assert Store().path == tmp_path / "x" / "parley.db"


def test_delete_cascades_and_order(tmp_path):
    store = Store(tmp_path / "p.db")
    a = store.create_conversation("a")
    b = store.create_conversation("b")
    store.add_message(a.id, "user", "to a")
    assert [c.title for c in store.conversations()] == ["a", "b"]  # most recently used first
    store.delete(a.id)
    assert store.messages(a.id) == [] and [c.id for c in store.conversations()] == [b.id]
