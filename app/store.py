"""Conversation history in SQLite: one small module, numbered migrations keyed by `PRAGMA user_version`.

Writes are a few rows per turn, so plain `sqlite3` on the UI thread is fast enough (milliseconds);
the model never runs here.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import platformdirs

DATA_DIR_ENV = "PARLEY_DATA_DIR"

# Migration N (1-based) brings the schema from version N-1 to N. Append, never edit a shipped one.
MIGRATIONS: list[str] = [
    # 1: conversations and their messages
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL DEFAULT 'New chat',
        system_prompt TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
        content TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
    """,
    # 2: a pasted document kept apart from the typed text, so the view can show it compactly
    "ALTER TABLE messages ADD COLUMN attachment TEXT;",
    # 3: small app settings (theme, ...)
    "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
]


def data_dir() -> Path:
    """`PARLEY_DATA_DIR` if set (tests, portable installs), else the platform's user data dir."""
    override = os.environ.get(DATA_DIR_ENV)
    return Path(override) if override else Path(platformdirs.user_data_dir("parley", appauthor=False))


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    system_prompt: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class StoredMessage:
    id: int
    role: str
    content: str  # what the user typed (or the reply); the attachment is separate
    attachment: str | None
    created_at: float


class Store:
    """The app's persistent state. Open once; all methods commit before returning."""

    def __init__(self, path: Path | None = None) -> None:
        if path is None:
            path = data_dir() / "parley.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA foreign_keys = ON")
        self.migrate()

    @property
    def version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self) -> None:
        """Apply the migrations this database has not seen, each in its own transaction."""
        for number in range(self.version + 1, len(MIGRATIONS) + 1):
            # executescript commits first, so BEGIN/COMMIT make migration and version bump one transaction
            self._db.executescript(f"BEGIN; {MIGRATIONS[number - 1]} PRAGMA user_version = {number}; COMMIT;")

    def close(self) -> None:
        self._db.close()

    # conversations
    def create_conversation(self, title: str = "New chat", system_prompt: str = "") -> Conversation:
        now = time.time()
        with self._db:
            cur = self._db.execute(
                "INSERT INTO conversations (title, system_prompt, created_at, updated_at) VALUES (?, ?, ?, ?)",
                (title, system_prompt, now, now),
            )
        return Conversation(cur.lastrowid, title, system_prompt, now, now)

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return Conversation(**dict(row)) if row else None

    def conversations(self) -> list[Conversation]:
        """Most recently used first."""
        rows = self._db.execute("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC").fetchall()
        return [Conversation(**dict(r)) for r in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        with self._db:
            self._db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        with self._db:
            self._db.execute(
                "UPDATE conversations SET system_prompt = ?, updated_at = ? WHERE id = ?",
                (system_prompt, time.time(), conversation_id),
            )

    def delete(self, conversation_id: int) -> None:
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # messages
    def add_message(self, conversation_id: int, role: str, content: str, attachment: str | None = None) -> int:
        now = time.time()
        with self._db:
            cur = self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, attachment, created_at) VALUES (?, ?, ?, ?, ?)",
                (conversation_id, role, content, attachment, now),
            )
            self._db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
        return cur.lastrowid

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT id, role, content, attachment, created_at FROM messages WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall()
        return [StoredMessage(**dict(r)) for r in rows]

    def delete_message(self, message_id: int) -> None:
        with self._db:
            self._db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    # settings
    def get_setting(self, key: str, default: str | None = None) -> str | None:
        row = self._db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_setting(self, key: str, value: str) -> None:
        with self._db:
            self._db.execute(
                "INSERT INTO settings (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    # export
    def export_markdown(self, conversation_id: int) -> str:
        """The conversation as a Markdown document: title, system prompt, then each turn."""
        conv = self.conversation(conversation_id)
        if conv is None:
            raise KeyError(conversation_id)
        parts = [f"# {conv.title}\n"]
        if conv.system_prompt:
            parts.append(f"**System:** {conv.system_prompt}\n")
        for m in self.messages(conversation_id):
            parts.append(f"## {'User' if m.role == 'user' else 'Assistant'}\n")
            if m.attachment:
                parts.append(f"<details><summary>Pasted document</summary>\n\n{m.attachment}\n\n</details>\n")
            parts.append(f"{m.content}\n")
        return "\n".join(parts)


def compose_user_content(text: str, attachment: str | None) -> str:
    """What the model sees for a user turn: the pasted document first, then the question."""
    if not attachment:
        return text
    return f"{attachment}\n\n{text}" if text else attachment
