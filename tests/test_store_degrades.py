"""The conversation store degrades instead of crashing: a locked, read-only, full, damaged or unopenable
database leaves every method returning, `problem` saying in one line where it is and what is wrong, and
the messages written meanwhile kept in memory and saved, in order, once the database can be written."""

from __future__ import annotations

import sqlite3

from parley.app.store import Store


def fill(store: Store) -> tuple[int, list[int]]:
    conv = store.create_conversation("kept", "be brief")
    ids = [store.add_message(conv.id, role, text) for role, text in (("user", "hi"), ("assistant", "hello"))]
    return conv.id, ids


def test_locked_database_keeps_messages_in_memory_and_saves_them_later(tmp_path):
    path = tmp_path / "p.db"
    store = Store(path, timeout=0.05)
    cid, _ = fill(store)
    other = sqlite3.connect(path)
    other.execute("BEGIN EXCLUSIVE")  # another program holds the write lock

    new = store.create_conversation("while locked")
    mid = store.add_message(new.id, "user", "typed while locked")
    store.add_message(cid, "user", "more")
    store.rename(cid, "renamed while locked")
    assert store.problem is not None and str(path) in store.problem and "locked" in store.problem
    assert new.id < 0 and mid < 0 and store.unsaved == 4
    assert [m.content for m in store.messages(new.id)] == ["typed while locked"]
    assert store.conversation(new.id).title == "while locked"
    assert not store.retry()

    other.rollback()
    other.close()
    assert store.retry() and store.problem is None and store.unsaved == 0
    again = Store(path)  # what is on disk
    titles = {c.title: c.id for c in again.conversations()}
    assert set(titles) == {"renamed while locked", "while locked"}
    assert [m.content for m in again.messages(titles["while locked"])] == ["typed while locked"]
    assert [m.content for m in again.messages(cid)] == ["hi", "hello", "more"]
    # the provisional ids the app holds still work
    store.delete_message(mid)
    assert again.messages(titles["while locked"]) == []
    assert store.conversation(new.id).title == "while locked"


def test_read_only_database_still_reads_and_never_raises(tmp_path):
    path = tmp_path / "p.db"
    cid, ids = fill(Store(path))
    store = Store(path)
    store._db.execute("PRAGMA query_only = ON")  # as a read-only file or folder behaves for sqlite
    store.add_message(cid, "user", "unsaved")
    store.rename(cid, "renamed")
    store.delete_message(ids[0])
    assert "read-only" in store.problem and str(path) in store.problem
    assert [m.content for m in store.messages(cid)] == ["hi", "hello", "unsaved"]
    assert store.conversation(cid).title == "kept"
    store._db.execute("PRAGMA query_only = OFF")
    assert store.retry() and store.problem is None
    assert [m.content for m in Store(path).messages(cid)] == ["hello", "unsaved"]
    assert Store(path).conversation(cid).title == "renamed"


def test_full_disk(tmp_path):
    path = tmp_path / "p.db"
    store = Store(path)
    cid, _ = fill(store)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # SQLITE_FULL, as a full disk gives
    store.add_message(cid, "user", "x" * 100_000)
    assert "full disk" in store.problem and store.unsaved == 1
    store._db.execute("PRAGMA max_page_count = 1000000")
    assert store.retry()
    assert Store(path).messages(cid)[-1].content == "x" * 100_000


def test_corrupt_database_at_start_up(tmp_path):
    path = tmp_path / "p.db"
    path.write_bytes(b"this is not a database" * 200)
    store = Store(path)
    assert "damaged" in store.problem and str(path) in store.problem
    assert store.conversations() == []
    conv = store.create_conversation("t")
    store.add_message(conv.id, "user", "still chatting")
    assert [m.content for m in store.messages(conv.id)] == ["still chatting"]
    assert [c.title for c in store.conversations()] == ["t"]
    assert store.export_markdown(conv.id).startswith("# t")
    assert path.read_bytes() == b"this is not a database" * 200  # never overwritten


def test_unopenable_location(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the data folder should be")
    store = Store(blocker / "parley.db")
    assert store.problem is not None and "parley.db" in store.problem
    conv = store.create_conversation("t")
    assert store.add_message(conv.id, "user", "hi") < 0


def test_one_damaged_conversation_is_skipped_with_a_message(tmp_path):
    path = tmp_path / "p.db"
    store = Store(path)
    good = store.create_conversation("good")
    store.add_message(good.id, "user", "fine")
    bad = store.create_conversation("bad")
    marker = "DAMAGE-HERE"
    store.add_message(bad.id, "user", "a" * 9000 + marker + "b" * 9000)  # spills onto overflow pages
    store.close()
    data = bytearray(path.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    page = data.index(marker.encode()) // page_size
    data[page * page_size : page * page_size + 4] = b"\xff\xff\xff\x00"  # its next-overflow-page pointer
    path.write_bytes(bytes(data))

    store = Store(path)
    assert store.problem is None
    assert [c.title for c in store.conversations()] == ["bad", "good"]
    assert store.messages(bad.id) == []
    assert store.problem is not None and f"conversation {bad.id}" in store.problem and "skipped" in store.problem
    assert [m.content for m in store.messages(good.id)] == ["fine"]
