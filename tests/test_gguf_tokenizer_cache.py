"""A GGUF's rebuilt tokenizer is cached in the Parley cache: the next launch reads it instead of rebuilding
and tokenizes exactly as the fresh one; a damaged or doctored cache file (bytes that still parse, a truncated
file, a hash-consistent entry `tokenizers` refuses, binary garbage) is ignored and rebuilt, never a crash; a
changed GGUF file (another modification time) never reads the old entry."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from parley.models import gguf_tokenizer, tokenizer_cache
from parley.models.resolve import embedded_model_path, resolve
from parley.models.tokenizer import load_tokenizer

TEXTS = ["Hello, world!", "  leading spaces and 1234567 digits", "emoji 😀👍🏽 中文 日本語",
         "<|im_start|>user\nhi<|im_end|>", "def f(x):\n    return x ** 2\n"]


@pytest.fixture
def gguf(tmp_path):
    """The embedded GGUF, copied so that its modification time can be changed."""
    path = tmp_path / "model.gguf"
    shutil.copyfile(embedded_model_path(), path)
    return path


def encodings(path) -> list[list[int]]:
    return [load_tokenizer(resolve(str(path))).encode(t) for t in TEXTS]


def no_rebuild(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("the vocabulary was rebuilt although the cached tokenizer was intact")

    monkeypatch.setattr(gguf_tokenizer, "build", refuse)


def test_the_next_launch_reads_the_cache_and_tokenizes_the_same(gguf, monkeypatch):
    fresh = encodings(gguf)
    assert tokenizer_cache.cache_path(gguf).is_file()
    with monkeypatch.context() as m:
        no_rebuild(m)
        assert encodings(gguf) == fresh


def _swap_two_tokens(entry: dict) -> None:
    """A well-formed tokenizer that encodes differently: two vocabulary ids exchanged (hash left as it was)."""
    tok = json.loads(entry["tokenizer"])
    vocab = tok["model"]["vocab"]
    vocab["Hello"], vocab["world"] = vocab["world"], vocab["Hello"]
    entry["tokenizer"] = json.dumps(tok)


@pytest.mark.parametrize("damage", ["doctored", "truncated", "refused", "garbage"])
def test_a_damaged_cache_file_is_rebuilt(gguf, monkeypatch, damage):
    fresh = encodings(gguf)
    path = tokenizer_cache.cache_path(gguf)
    entry = json.loads(path.read_text())
    if damage == "doctored":
        _swap_two_tokens(entry)
        path.write_text(json.dumps(entry))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "refused":  # its hash matches, but it is no tokenizer
        entry["tokenizer"] = '{"model": 3}'
        entry["sha256"] = hashlib.sha256(entry["tokenizer"].encode()).hexdigest()
        path.write_text(json.dumps(entry))
    else:
        path.write_bytes(bytes(range(256)) * 8)
    assert encodings(gguf) == fresh, damage
    with monkeypatch.context() as m:  # rebuilt and cached afresh: the next launch reads it again
        no_rebuild(m)
        assert encodings(gguf) == fresh, damage


def test_a_changed_gguf_does_not_read_the_old_entry(gguf, monkeypatch):
    encodings(gguf)
    old = tokenizer_cache.cache_path(gguf)
    entry = json.loads(old.read_text())
    _swap_two_tokens(entry)  # what a stale entry would give, were it read
    entry["sha256"] = hashlib.sha256(entry["tokenizer"].encode()).hexdigest()
    old.write_text(json.dumps(entry))
    st = gguf.stat()
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert tokenizer_cache.cache_path(gguf) != old
    assert encodings(gguf) == [load_tokenizer(resolve(str(embedded_model_path()))).encode(t) for t in TEXTS]
