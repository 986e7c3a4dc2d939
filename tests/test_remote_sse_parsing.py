"""Server-sent events as the servers write them: comments and keep-alives skipped, multi-line data joined,
the stream ended by `[DONE]` or by the connection."""

from __future__ import annotations

from parley.engine.remote import iter_sse


def test_events_comments_and_done():
    lines = [": keep-alive", "", "event: message", 'data: {"a": 1}', "", "data:{\"b\": 2}", "",
             "data: line one", "data: line two", "", "data: [DONE]", "", 'data: {"after": "done"}', ""]
    assert list(iter_sse(lines)) == ['{"a": 1}', '{"b": 2}', "line one\nline two"]


def test_stream_cut_without_blank_line_or_done():
    assert list(iter_sse(['data: {"x": 1}', "", 'data: {"y": 2}'])) == ['{"x": 1}', '{"y": 2}']
