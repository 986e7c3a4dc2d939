"""Conversation history in SQLite: one small module, numbered migrations keyed by `PRAGMA user_version`.

Writes are a few rows per turn, so plain `sqlite3` on the UI thread is fast enough (milliseconds);
the model never runs here. History is a convenience, never a dependency: a database that cannot be
written or read leaves the app chatting, with `Store.problem` saying why (see `Store`).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import platformdirs

DATA_DIR_ENV = "PARLEY_DATA_DIR"
log = logging.getLogger("parley.store")

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
    # 4: settings live in settings.json alone (app/settings.py: atomic, readable, kept when the database is
    # damaged); `migrate` carries the rows of this table there first
    "DROP TABLE settings;",
]
SETTINGS_DROPPED = 4


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
    """The app's persistent state. Open once; all methods commit before returning, and none raises.

    The store degrades instead of taking the app down: when the database is locked by another program,
    read-only, on a full disk, damaged, or cannot be opened, `problem` says in one line where it is and
    what is wrong, reads return what can be read, and writes wait in memory (with provisional negative
    ids) and are retried, in order, on each later write or `retry()`. Chatting never depends on it.
    """

    def __init__(self, path: Path | None = None, timeout: float = 0.25) -> None:
        self.path = path if path is not None else data_dir() / "parley.db"
        self.problem: str | None = None  # None while healthy; else one line: where the database is, what is wrong
        self._timeout = timeout  # the UI thread writes: a locked database must not freeze it for long
        self._db: sqlite3.Connection | None = None
        self._pending: list[_Write] = []  # writes not yet saved, oldest first
        self._ids: dict[int, int] = {}  # provisional id -> its id in the database, once saved
        self._next_provisional = -1
        self._open()

    @property
    def version(self) -> int:
        return self._read(lambda db: db.execute("PRAGMA user_version").fetchone()[0], 0)

    @property
    def unsaved(self) -> int:
        """How many writes are waiting in memory for the database to come back."""
        return len(self._pending)

    def migrate(self) -> None:
        """Apply the migrations this database has not seen, each in its own transaction."""
        assert self._db is not None
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        for number in range(version + 1, len(MIGRATIONS) + 1):
            if number == SETTINGS_DROPPED and version >= 3:
                self._carry_settings()
            # executescript commits first, so BEGIN/COMMIT make migration and version bump one transaction
            self._db.executescript(f"BEGIN; {MIGRATIONS[number - 1]} PRAGMA user_version = {number}; COMMIT;")

    def _carry_settings(self) -> None:
        """The rows of the old settings table into settings.json (a value already there wins)."""
        from .settings import Settings

        assert self._db is not None
        rows = self._db.execute("SELECT key, value FROM settings").fetchall()
        if rows:
            settings = Settings()
            for key, value in rows:
                settings.values.setdefault(key, value)
            settings.save()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def retry(self) -> bool:
        """Try to save what waits in memory; True when nothing is left unsaved."""
        self._flush()
        return not self._pending

    # conversations
    def create_conversation(self, title: str = "New chat", system_prompt: str = "") -> Conversation:
        now = time.time()

        def write(db: sqlite3.Connection) -> int:
            return db.execute(
                "INSERT INTO conversations (title, system_prompt, created_at, updated_at) VALUES (?, ?, ?, ?)",
                (title, system_prompt, now, now),
            ).lastrowid

        record = Conversation(0, title, system_prompt, now, now)
        cid = self._write(write, record)
        return Conversation(cid, title, system_prompt, now, now)

    def conversation(self, conversation_id: int) -> Conversation | None:
        for w in self._pending:
            if isinstance(w.record, Conversation) and w.provisional == conversation_id:
                return replace(w.record, id=conversation_id)
        real = self._real(conversation_id)
        row = self._read(lambda db: db.execute("SELECT * FROM conversations WHERE id = ?", (real,)).fetchone(), None)
        return _conversation(row) if row else None

    def conversations(self) -> list[Conversation]:
        """Most recently used first; those not saved yet first of all."""
        rows = self._read(
            lambda db: db.execute("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC").fetchall(), [])
        unsaved = [replace(w.record, id=w.provisional) for w in reversed(self._pending)
                   if isinstance(w.record, Conversation) and w.provisional is not None]
        return unsaved + [_conversation(r) for r in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        self._write(lambda db: db.execute("UPDATE conversations SET title = ? WHERE id = ?",
                                          (title, self._real(conversation_id))))

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        now = time.time()
        self._write(lambda db: db.execute("UPDATE conversations SET system_prompt = ?, updated_at = ? WHERE id = ?",
                                          (system_prompt, now, self._real(conversation_id))))

    def delete(self, conversation_id: int) -> None:
        self._write(lambda db: db.execute("DELETE FROM conversations WHERE id = ?", (self._real(conversation_id),)))

    # messages
    def add_message(self, conversation_id: int, role: str, content: str, attachment: str | None = None) -> int:
        """The message's id: its row id, or a provisional negative id while it waits in memory."""
        now = time.time()

        def write(db: sqlite3.Connection) -> int:
            cid = self._real(conversation_id)
            rowid = db.execute(
                "INSERT INTO messages (conversation_id, role, content, attachment, created_at) VALUES (?, ?, ?, ?, ?)",
                (cid, role, content, attachment, now),
            ).lastrowid
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, cid))
            return rowid

        record = (conversation_id, StoredMessage(0, role, content, attachment, now))
        return self._write(write, record)

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        """The conversation's messages; [] (and `problem` set) when it cannot be read, e.g. a damaged page."""
        real = self._real(conversation_id)
        rows = []
        if real > 0:
            rows = self._read(lambda db: db.execute(
                "SELECT id, role, content, attachment, created_at FROM messages WHERE conversation_id = ? ORDER BY id",
                (real,),
            ).fetchall(), [], f"conversation {conversation_id} could not be read and was skipped")
        unsaved = [replace(w.record[1], id=w.provisional) for w in self._pending
                   if isinstance(w.record, tuple) and self._real(w.record[0]) == real]
        return [m for m in map(_message, rows) if m is not None] + unsaved

    def delete_message(self, message_id: int) -> None:
        self._write(lambda db: db.execute("DELETE FROM messages WHERE id = ?", (self._real(message_id),)))

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

    # the degraded mode
    def _open(self) -> bool:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=self._timeout, check_same_thread=False)
            self._db.row_factory = sqlite3.Row
            self._db.text_factory = lambda raw: raw.decode("utf-8", "replace")  # a foreign row's bad UTF-8
            self._db.execute("PRAGMA foreign_keys = ON")
            self.migrate()
            return True
        except (sqlite3.Error, OSError) as e:
            self.close()
            self._failed(e)
            return False

    def _real(self, some_id: int) -> int:
        return self._ids.get(some_id, some_id)

    def _read(self, query: Callable[[sqlite3.Connection], Any], default: Any, what: str | None = None) -> Any:
        if self._db is None and not self._open():
            return default
        assert self._db is not None
        try:
            return query(self._db)
        except (sqlite3.Error, OSError) as e:
            self._failed(e, what)
            return default

    def _write(self, write: Callable[[sqlite3.Connection], Any], record: Any = None) -> int:
        """Queue `write` behind any unsaved ones and try to save them all; the provisional id, or its row id."""
        provisional = None
        if isinstance(record, (Conversation, tuple)):
            provisional = self._next_provisional
            self._next_provisional -= 1
        self._pending.append(_Write(write, provisional, record))
        self._flush()
        return self._real(provisional) if provisional is not None else 0

    def _flush(self) -> None:
        if not self._pending or (self._db is None and not self._open()):
            return
        assert self._db is not None
        while self._pending:
            w = self._pending[0]
            try:
                with self._db:
                    rowid = w.write(self._db)
            except sqlite3.IntegrityError:  # e.g. a message of a conversation deleted meanwhile: nothing to keep
                rowid = None
            except (sqlite3.Error, OSError) as e:
                self._failed(e)
                return
            if w.provisional is not None and rowid is not None:
                self._ids[w.provisional] = rowid
            self._pending.pop(0)
        self.problem = None

    def _failed(self, error: Exception, what: str | None = None) -> None:
        text = str(error).lower()
        if "locked" in text or "busy" in text:
            why = "locked by another program (another Parley?)"
        elif "readonly" in text or "read-only" in text:
            why = "read-only"
        elif "full" in text or getattr(error, "errno", None) == errno.ENOSPC:
            why = "on a full disk"
        elif "not a database" in text or "malformed" in text or "corrupt" in text:
            why = "damaged (move it away to start a new history)"
        else:
            why = f"unusable ({error})"
        saved = "replies still work; unsaved messages are kept in memory and saved when it can be written"
        self.problem = f"{what}: {self.path} is {why}" if what else \
            f"conversation history {self.path} is {why}; {saved}"
        log.warning("%s", self.problem)


@dataclass
class _Write:
    """A write waiting to be saved: `write(db)` returns the new row id, if it makes one."""

    write: Callable[[sqlite3.Connection], Any]
    provisional: int | None  # the negative id handed out for the row it makes
    record: Any  # what reads show until it is saved: a Conversation, (conversation id, StoredMessage)


def _text(value: Any) -> str:
    """A column read as text: SQLite keeps any type in any column, and a database edited by another program
    may hold a BLOB, a number or NULL where Parley writes text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _time(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def _conversation(row: sqlite3.Row) -> Conversation:
    return Conversation(row["id"], _text(row["title"]) or "New chat", _text(row["system_prompt"]),
                        _time(row["created_at"]), _time(row["updated_at"]))


def _message(row: sqlite3.Row) -> StoredMessage | None:
    """None for a row of no known role (the chat has no place for it; it stays in the database)."""
    role = _text(row["role"])
    if role not in ("user", "assistant"):
        return None
    attachment = row["attachment"]
    return StoredMessage(row["id"], role, _text(row["content"]), None if attachment is None else _text(attachment),
                         _time(row["created_at"]))


def compose_user_content(text: str, attachment: str | None) -> str:
    """What the model sees for a user turn: the pasted document first, then the question."""
    if not attachment:
        return text
    return f"{attachment}\n\n{text}" if text else attachment
