"""`parley serve` is safe to leave running: a web page cannot drive it, a request cannot smuggle another.

Through raw sockets, byte for byte (an HTTP client library would refuse to send most of these):
- a Host that is not the address it binds (DNS rebinding), or none, or two: 403, and the engine never runs;
- an Origin (a request from a web page) not in --allow-origin: 403; one in it gets its CORS headers;
- a body that is not application/json (text/plain is a CORS "simple request" any page may send): 415;
- Transfer-Encoding (with or without Content-Length), two Content-Lengths, one that is not digits: refused and
  the connection closed, so the bytes after the headers are never run as a second request;
- control characters of a request line are escaped in the log (a terminal would run them).
Each case counts the answers on the connection: a smuggled request would show as a second `HTTP/1.1` status line.
"""

from __future__ import annotations

import json
import re

import pytest
from serve_fake_engine import serve_engine
from serve_support import running_server

from parley.app import cli
from parley.app.server.api import host_names
from parley.bench.faults_network import exchange

BODY = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).encode()
SMUGGLED = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(scope="module")
def served():
    engine = serve_engine(context_window=256)
    with running_server(engine, timeout=0.5, allow_origins=["http://localhost:3000"]) as (server, url):
        yield server, engine


def send(server, head: str, body: bytes = b"") -> tuple[list[int], bytes]:
    """(the status of every answer on the connection, the whole answer)."""
    answer = exchange(server.server_address[:2], head.replace("\n", "\r\n").encode() + b"\r\n" + body)
    statuses = [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]
    return statuses, answer


def post(host: str = "127.0.0.1", kind: str = "application/json", extra: str = "", length: int | None = None) -> str:
    n = len(BODY) if length is None else length
    return (f"POST /v1/chat/completions HTTP/1.1\nHost: {host}\nContent-Type: {kind}\nContent-Length: {n}\n"
            f"{extra}Connection: close\n")


def error(answer: bytes) -> dict:
    return json.loads(answer.partition(b"\r\n\r\n")[2])["error"]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8000", "localhost", "LOCALHOST:1", "localhost."])
def test_its_own_addresses_are_answered(served, host):
    server, _ = served
    assert send(server, post(host), BODY)[0] == [200]


@pytest.mark.parametrize("head", [
    post("attacker.example"), post("attacker.example:8000"), post("127.0.0.1.attacker.example"),
    post("127.0.0.1:80:80"), post("[::1"), post("10.0.0.7"),
    f"POST /v1/chat/completions HTTP/1.0\nContent-Type: application/json\nContent-Length: {len(BODY)}\n",
    post(extra="Host: attacker.example\n"),
], ids=["name", "name-port", "suffix", "two-ports", "open-bracket", "other-ip", "no-host", "two-hosts"])
def test_any_other_host_is_refused_before_the_engine_runs(served, head):
    server, engine = served
    calls = engine.tokenizer.calls
    statuses, answer = send(server, head, BODY)
    assert statuses == [403] and error(answer)["param"] == "Host", answer[:300]
    assert "--allow-host" in error(answer)["message"]
    assert engine.tokenizer.calls == calls


def test_web_pages_are_refused_unless_allowed(served):
    server, engine = served
    calls = engine.tokenizer.calls
    statuses, answer = send(server, post(extra="Origin: https://attacker.example\n"), BODY)
    assert statuses == [403] and "--allow-origin" in error(answer)["message"]
    assert send(server, post(extra="Origin: null\n"), BODY)[0] == [403]  # sandboxed frames, file:// pages
    assert engine.tokenizer.calls == calls
    statuses, answer = send(server, post(extra="Origin: http://localhost:3000\n"), BODY)
    assert statuses == [200] and b"Access-Control-Allow-Origin: http://localhost:3000\r\n" in answer
    preflight = ("OPTIONS /v1/chat/completions HTTP/1.1\nHost: 127.0.0.1\nOrigin: http://localhost:3000\n"
                 "Access-Control-Request-Method: POST\nConnection: close\n")
    statuses, answer = send(server, preflight)
    assert statuses == [204] and b"Access-Control-Allow-Headers: Authorization, Content-Type" in answer
    statuses, _ = send(server, preflight.replace("localhost:3000", "attacker.example"))
    assert statuses == [403]


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                  "", "application/jsonx"])
def test_a_body_that_is_not_json_by_its_type_is_not_run(served, kind):
    server, engine = served
    calls = engine.tokenizer.calls
    statuses, answer = send(server, post(kind=kind), BODY)
    assert statuses == [415] and error(answer)["param"] == "Content-Type"
    assert engine.tokenizer.calls == calls
    assert send(server, post(kind="Application/JSON; charset=utf-8"), BODY)[0] == [200]


def chunked(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


@pytest.mark.parametrize(("head", "body"), [
    ("POST /v1/chat/completions HTTP/1.1\nHost: 127.0.0.1\nContent-Type: application/json\n"
     "Transfer-Encoding: chunked\n", chunked(BODY) + SMUGGLED),
    (post(extra="Transfer-Encoding: chunked\n", length=len(chunked(BODY))), chunked(BODY) + SMUGGLED),
    (post(extra=f"Content-Length: {len(BODY) + 10}\n"), BODY + SMUGGLED),
    (post(extra=f"Content-Length: {len(BODY)}\n"), BODY + SMUGGLED),
    (post().replace(f"Content-Length: {len(BODY)}", f"Content-Length: +{len(BODY)}"), BODY + SMUGGLED),
    (post().replace(f"Content-Length: {len(BODY)}", f"Content-Length: {len(BODY)}, {len(BODY)}"), BODY + SMUGGLED),
    (f"GET /v1/models HTTP/1.1\nHost: 127.0.0.1\nContent-Length: {len(SMUGGLED)}\n", SMUGGLED),
], ids=["chunked", "chunked-and-length", "two-lengths", "same-length-twice", "plus-sign", "list", "get-with-body"])
def test_ambiguous_framing_runs_one_request_at_most(served, head, body):
    """Keep-alive connections (no Connection: close): the smuggled GET would be answered as a second request."""
    server, _ = served
    statuses, answer = send(server, head.replace("Connection: close\n", ""), body)
    assert len(statuses) == 1, answer[:400]
    assert statuses[0] in (200, 400, 501)
    if statuses[0] != 200:
        assert error(answer)["param"] in ("Transfer-Encoding", "Content-Length")


def test_control_characters_of_a_request_are_escaped_in_the_log(served):
    server, _ = served
    server.logged.clear()
    send(server, "GET /v1/\x1b]0;pwned\x07\x1b[2J HTTP/1.1\nHost: 127.0.0.1\nConnection: close\n")
    send(server, "GET /\x1b[31m\r\n")  # an HTTP/0.9-style line, answered by the standard library's send_error
    assert server.logged and not any("\x1b" in line or "\x07" in line for line in server.logged)
    assert any("\\x1b]0;pwned\\x07" in line for line in server.logged), server.logged


def test_a_wildcard_bind_answers_this_machines_addresses_not_names():
    ok = host_names("0.0.0.0")
    assert ok("10.1.2.3") and ok("localhost") and ok("::1")
    assert not ok("attacker.example")
    assert host_names("0.0.0.0", ["parley.lan"])("Parley.LAN")
    assert not host_names("127.0.0.1")("192.168.1.9")


def test_a_key_on_the_command_line_is_refused_before_anything_loads(capsys, monkeypatch):
    monkeypatch.delenv("PARLEY_API_KEY", raising=False)
    for argv in (["serve", "--api-key", "sk-secret-1"], ["generate", "--server", "http://127.0.0.1:9/v1",
                                                        "--api-key", "sk-secret-1", "hi"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "PARLEY_API_KEY" in err and "sk-secret-1" not in err, err
