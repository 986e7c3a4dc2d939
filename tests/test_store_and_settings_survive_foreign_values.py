"""Files another program (or a damaged disk) changed: rows of the conversation store holding BLOBs, numbers or
bad UTF-8 where Parley writes text, a settings.json nested 100,000 deep, cache manifests whose `source` is a
list. Each is read as far as it can be, never a traceback, and nothing in the store is lost or rewritten."""

from __future__ import annotations

import json
import sqlite3

from parley.app.screens.model_picker import cached_models
from parley.app.settings import Settings
from parley.app.store import Store


def test_foreign_rows_read_as_text_and_stay_untouched(tmp_path):
    path = tmp_path / "parley.db"
    store = Store(path)
    conv = store.create_conversation("kept")
    store.add_message(conv.id, "user", "hello")
    store.close()
    db = sqlite3.connect(path)
    db.text_factory = bytes  # the rows as stored, bad UTF-8 included
    db.execute("INSERT INTO messages (conversation_id, role, content, attachment, created_at) "
               "VALUES (?, 'assistant', x'fffe00', x'01', x'02')", (conv.id,))
    db.execute("INSERT INTO messages (conversation_id, role, content, created_at) "
               "VALUES (?, 'user', CAST(x'c328' AS TEXT), 'soon')", (conv.id,))
    db.execute("INSERT INTO messages (conversation_id, role, content, created_at) VALUES (?, 'user', 42, 1.0)",
               (conv.id,))
    db.execute("UPDATE conversations SET title = x'00ff', system_prompt = 7")
    db.commit()
    before = db.execute("SELECT * FROM messages ORDER BY id").fetchall()
    db.close()

    store = Store(path)
    [c] = store.conversations()
    assert isinstance(c.title, str) and c.system_prompt == "7" and store.problem is None
    messages = store.messages(conv.id)
    assert [m.content for m in messages] == ["hello", "\ufffd\ufffd\x00", "\ufffd(", "42"]
    assert messages[1].attachment == "\x01" and messages[1].created_at == 0.0
    assert "hello" in store.export_markdown(conv.id)
    store.close()
    db = sqlite3.connect(path)
    db.text_factory = bytes
    assert db.execute("SELECT * FROM messages ORDER BY id").fetchall() == before  # nothing lost or rewritten


def test_a_settings_file_nested_too_deep_falls_back_to_defaults(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    settings = Settings(path)
    assert settings.values == {} and "nests too deeply" in settings.problem and "\n" not in settings.problem


def test_cache_manifests_of_the_wrong_shape_are_not_offered(tmp_path):
    for name, manifest in [("list", {"source": ["org/model"]}), ("text", {"source": "org/model"}),
                           ("deep", None), ("good", {"source": {"repo_id": "org/good"}})]:
        folder = tmp_path / name
        folder.mkdir()
        text = "[" * 100_000 + "]" * 100_000 if manifest is None else json.dumps(manifest)
        (folder / "manifest.json").write_text(text)
    assert cached_models(tmp_path) == ["org/good"]
