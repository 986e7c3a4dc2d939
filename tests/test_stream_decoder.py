"""Streaming detokenisation never emits half a UTF-8 character, and its pieces add up to decode(ids)."""

import pytest

from parley.models.resolve import embedded_model_path, resolve
from parley.models.tokenizer import load_tokenizer

TEXTS = [
    "Emoji: 😀👍🏽🇫🇷👨‍👩‍👧 and more 🎉!",
    "CJK: 日本語のテキスト、中文句子。한국어 문장.",
    "Mixed ✓ naïve 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑ x² — done.\n```python\nprint('hé')\n```",
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve(str(embedded_model_path())))


def stream_all(tok, ids):
    stream = tok.stream()
    deltas = [stream.push(i) for i in ids]
    return deltas, stream.flush()


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_are_whole_characters_and_add_up(tok, text):
    ids = tok.encode(text)
    deltas, tail = stream_all(tok, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + tail == tok.decode(ids) == text
    assert tail == ""
    # the case that matters happened: some token ended inside a character and was held back
    assert any(d == "" for d in deltas)


def test_a_character_split_over_tokens_is_held_until_complete(tok):
    ids = tok.encode("😀")
    assert len(ids) > 1  # byte-level BPE spells this emoji in several tokens
    stream = tok.stream()
    assert [stream.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert stream.push(ids[-1]) == "😀"


def test_special_tokens_are_not_shown(tok):
    ids = tok.encode("Hi 👋<|im_end|>")
    deltas, tail = stream_all(tok, ids)
    assert "".join(deltas) + tail == "Hi 👋" == tok.decode(ids, skip_special_tokens=True)


def test_flush_releases_an_unfinished_character(tok):
    ids = tok.encode("a😀")
    stream = tok.stream()
    shown = "".join(stream.push(i) for i in ids[:-1])
    assert shown == "a"
    assert stream.flush() == tok.decode(ids[:-1])[1:]  # the bytes so far, as U+FFFD
