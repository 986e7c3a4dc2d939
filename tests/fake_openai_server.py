"""A small stand-in for another OpenAI-compatible server: it answers GETs from a table and replays a scripted
server-sent-event stream for each POST, recording what the client sent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, gets: dict[str, Any], streams: list[list[str]], headers: dict[str, str]) -> None:
        self.gets = gets  # path -> JSON body (a path not listed answers 404)
        self.streams = list(streams)  # one list of `data:` payloads per POST, in order
        self.headers = headers  # sent with every answer, e.g. {"Server": "llama.cpp"}
        self.posts: list[tuple[str, dict[str, Any], dict[str, str]]] = []  # (path, body, headers with lower-case names)
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        for name, value in self.server.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path in self.server.gets:
            self._answer(200, json.dumps(self.server.gets[self.path]).encode(), "application/json")
        else:
            self._answer(404, b'{"error": {"message": "not found"}}', "application/json")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.posts.append((self.path, body, {k.lower(): v for k, v in self.headers.items()}))
        script = self.server.streams.pop(0)
        text = "".join(f"data: {payload}\n\n" for payload in script)
        self._answer(200, text.encode(), "text/event-stream")


@contextmanager
def fake_server(gets: dict[str, Any], streams: list[list[str]],
                headers: dict[str, str] | None = None) -> Iterator[tuple[FakeServer, str]]:
    server = FakeServer(gets, streams, headers or {})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
