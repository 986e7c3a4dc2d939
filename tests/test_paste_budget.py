"""Paste budgeting: what fits beside the conversation, the chat template's framing and the reply room."""

from __future__ import annotations

from parley.app.paste_budget import (
    TEMPLATE_TOKENS_PER_MESSAGE,
    budget,
    fit_text,
    normalise_newlines,
    too_long_message,
)

count = lambda t: len(t.split())  # one token a word


def test_budget_keeps_the_reply_room_and_the_framing():
    b = budget(window=1000, conversation_tokens=300, messages=2, max_new_tokens=100)
    assert b.reserve == 100
    assert b.used == 300 + TEMPLATE_TOKENS_PER_MESSAGE * 4  # two earlier messages, the new one, the reply
    assert b.free == 1000 - b.used - 100
    # The reply room is capped at a quarter of the window, and nothing is ever negative.
    assert budget(400, 0, 0, 10_000).reserve == 100
    assert budget(100, 5_000, 10, 50).free == 0


def test_a_document_cut_to_the_free_room_plus_everything_else_fits_the_window():
    window, max_new = 500, 128
    b = budget(window, 200, 3, max_new)
    doc = "\n".join("word " * 7 for _ in range(100))
    kept, kept_tokens = fit_text(count, doc, b.free)
    assert kept_tokens <= b.free
    assert b.used + kept_tokens + b.reserve <= window


def test_fit_text_keeps_whole_lines_when_it_can():
    text = "a b c\nd e f\ng h i"
    assert fit_text(count, text, 6) == ("a b c\nd e f", 6)
    assert fit_text(count, text, 2) == ("a b ", 2)  # the first line alone is too long: cut inside it
    assert fit_text(count, text, 100) == (text, 9)
    assert fit_text(count, text, 0) == ("", 0)


def test_cr_and_crlf_line_endings_count_as_lines():
    assert normalise_newlines("a\r\nb\rc\n") == "a\nb\nc\n"


def test_too_long_message_names_the_figures():
    b = budget(400, 16, 2, 100)
    message = too_long_message(1070, b, "x\n" * 213 + "x", "x\nx", 2)
    assert message.startswith(f"It is 1,070 tokens, but only {b.free} fit: the context window is 400 tokens")
    assert "100 are kept for the reply" in message and "first 2 of 214 lines (2 tokens)" in message
