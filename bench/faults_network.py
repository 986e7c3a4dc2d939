"""The network cases of `parley bench faults`: a hostile client against `parley serve`, hostile servers against
the `--server` backend. Each case is one a probe found answering 500, raising or hanging (issue 25).

A serve case is handled cleanly when the answer is what the case expects (a 4xx naming the problem, or the
reply itself) with no internal text in its body and nothing in the server's log but one-line notes; a remote
case when the reply ends with one line (a Done("error") or "length") or connect raises a one-line ValueError.
Every case has a deadline: past it, it counts as a hang. "data lost" for serve: after all cases, a greedy
reply differs from the one the server gave before them.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import resource
import socket
import struct
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

KEY = "sk-bench-7f3a9c"


def _tally(results: list[tuple[str, str, str]]) -> dict[str, Any]:
    """(case, outcome, detail) -> the table's figures; outcome is clean | traceback | hang | unclear."""
    count = {o: sum(r[1] == o for r in results) for o in ("clean", "traceback", "hang", "unclear")}
    return {"tried": len(results), "clean": count["clean"], "tracebacks": count["traceback"],
            "hangs": count["hang"], "unclear": count["unclear"],
            "failures": [{"case": c, "why": o, "detail": d[:300]} for c, o, d in results if o != "clean"]}


def _in_thread(fn: Callable[[], Any], timeout: float) -> tuple[str, Any]:
    """("ok", result) | ("raised", the exception's traceback text) | ("hang", None)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["ok"] = fn()
        except BaseException:  # noqa: BLE001 (a bench counts what escapes, it does not judge it here)
            box["raised"] = traceback.format_exc()

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return "hang", None
    return ("ok", box["ok"]) if "ok" in box else ("raised", box["raised"])


# -- parley serve against a hostile client ----------------------------------------------------------


def exchange(address: tuple[str, int], data: bytes, *, shut_write: bool = False, reset: bool = False,
              timeout: float = 60.0) -> bytes:
    with socket.create_connection(address, timeout=timeout) as s:
        s.sendall(data)
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return b""
        if shut_write:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def _post(body: bytes, *, length: int | None = None, key: str | None = KEY, path: str = "/v1/chat/completions",
          close: bool = True) -> bytes:
    auth = f"Authorization: {key}\r\n" if key is not None else ""
    n = len(body) if length is None else length
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n"
            f"Content-Length: {n}\r\n"
            + ("Connection: close\r\n" if close else "") + "\r\n").encode() + body


def _final(answer: bytes) -> bytes:
    """The answer past any interim 1xx responses, which every HTTP/1.1 client skips (`parley serve` sends a
    `100 Continue` to probe a client that half-closed its socket)."""
    while answer.startswith(b"HTTP/1.1 1") and b"\r\n\r\n" in answer:
        answer = answer.partition(b"\r\n\r\n")[2]
    return answer


def _status(answer: bytes) -> int:
    try:
        return int(_final(answer).split(b"\r\n", 1)[0].split()[1])
    except (IndexError, ValueError):
        return 0


def _bad_body(answer: bytes) -> str | None:
    """Why an error body leaks or is malformed, else None."""
    body = _final(answer).partition(b"\r\n\r\n")[2]
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return "no JSON error body"
    if "Traceback" in message or re.search(r"(/[\w.-]+){2,}", message) or "File \"" in message:
        return f"internal text in the error body: {message[:120]}"
    return None


def serve_cases(engine: Any, timeout: float) -> dict[str, Any]:
    from ..app.server.api import make_server  # app: the HTTP server is what these cases attack

    logged: list[str] = []
    stderr = io.StringIO()
    server = make_server(engine, "127.0.0.1", 0, api_key=KEY, log=logged.append, timeout=2.0)
    address = server.server_address[:2]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    bearer = f"Bearer {KEY}"
    greedy = json.dumps({"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8,
                         "temperature": 0}).encode()

    def reply_text() -> str:
        answer = exchange(address, _post(greedy, key=bearer))
        return json.loads(answer.partition(b"\r\n\r\n")[2])["choices"][0]["message"]["content"]

    def expect(status: int, words: str = "") -> Callable[[bytes], str | None]:
        def check(answer: bytes) -> str | None:
            if _status(answer) != status:
                return f"status {_status(answer)}, expected {status}: {answer[:160]!r}"
            if status >= 400:
                bad = _bad_body(answer) if answer.partition(b"\r\n\r\n")[2] else None
                if bad:
                    return bad
            if words and words.encode() not in answer:
                return f"the answer does not say {words!r}"
            return None
        return check

    def closed(answer: bytes) -> str | None:
        return None if answer == b"" else f"expected the connection closed, got {answer[:80]!r}"

    msg = [{"role": "user", "content": "Hi"}]
    body = lambda **kw: json.dumps({"messages": msg, "max_tokens": 2, **kw}).encode()  # noqa: E731
    cases: list[tuple[str, Callable[[], bytes], Callable[[bytes], str | None]]] = [
        ("seed >= 2^64", lambda: exchange(address, _post(body(seed=2**64), key=bearer)), expect(400, "seed")),
        ("lone surrogate in content", lambda: exchange(address, _post(json.dumps(
            {"messages": [{"role": "user", "content": "x\ud800y"}]}).encode(), key=bearer)),
         expect(400, "surrogate")),
        ("100,000 nested [", lambda: exchange(address, _post(b"[" * 100_000, key=bearer)), expect(400, "deeply")),
        ("Content-Length -5", lambda: exchange(address, _post(b"{}", length=-5, key=bearer)),
         expect(400, "Content-Length")),
        ("content over 16 M characters", lambda: exchange(address, _post(json.dumps(
            {"messages": [{"role": "user", "content": "y" * (16 << 20)}]}).encode(), key=bearer)),
         expect(400, "characters")),
        ("Content-Length larger than the body", lambda: exchange(address, _post(b"{}", length=1000, key=bearer)),
         expect(408)),
        ("half a request, then silence", lambda: exchange(address, b"POST /v1/chat/completions HTTP/1.1\r\nHo"),
         closed),
        ("half-close after a valid request", lambda: exchange(address, _post(body(), key=bearer), shut_write=True),
         expect(200, "choices")),
        ("keep-alive reset", lambda: exchange(address, _post(body(), key=bearer, close=False), reset=True),
         lambda answer: None),
        ("key + suffix", lambda: exchange(address, _post(body(), key=bearer + "x")), expect(401)),
        ("key minus its last character", lambda: exchange(address, _post(body(), key=bearer[:-1])), expect(401)),
        ("key in another case", lambda: exchange(address, _post(body(), key=bearer.swapcase())), expect(401)),
        ("key with inner whitespace", lambda: exchange(address, _post(body(), key="Bearer  " + KEY)),
         expect(401)),
        ("no key", lambda: exchange(address, _post(body(), key=None)), expect(401)),
        ("bad JSON", lambda: exchange(address, _post(b"{oops", key=bearer)), expect(400, "JSON")),
        ("wrong types", lambda: exchange(address, _post(body(temperature="hot", stop=5), key=bearer)),
         expect(400, "temperature")),
    ]
    results = []
    with contextlib.redirect_stderr(stderr):
        before = reply_text()
        for name, send, check in cases:
            mark = len(logged)
            state, value = _in_thread(send, timeout)
            if state == "hang":
                results.append((name, "hang", f"no answer within {timeout:.0f} s"))
                continue
            if state == "raised":
                results.append((name, "unclear", value.strip().splitlines()[-1]))
                continue
            why = check(value)
            log = "\n".join(logged[mark:])
            if _status(value) == 500 or "Traceback" in log:
                results.append((name, "traceback", why or log[-200:]))
            else:
                results.append((name, "clean" if why is None else "unclear", why or ""))
        after = reply_text()
    server.shutdown()
    server.server_close()
    out = _tally(results)
    if "Traceback" in stderr.getvalue():
        out["tracebacks"] += 1
        out["failures"].append({"case": "(server stderr)", "why": "traceback", "detail": stderr.getvalue()[-300:]})
    out["data_lost"] = int(after != before)
    return out


# -- the --server backend against a hostile server --------------------------------------------------

MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


@contextmanager
def hostile_server(models: Any, answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """GET /v1/models answers `models` (or `models(connection)`, when it is a function); every POST is answered by
    `answer(connection)`."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            if head.startswith(b"GET") and callable(models):
                models(conn)
            elif head.startswith(b"GET"):
                body = json.dumps(models).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                             b"Connection: close\r\n\r\n%s" % (len(body), body))
            else:
                answer(conn)

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(timeout=10)
        listener.close()


def _events(*payloads: str) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(SSE_HEAD + b"".join(f"data: {p}\n\n".encode() for p in payloads))
    return answer


def _silent(conn: socket.socket) -> None:
    while conn.recv(65536):
        pass


def _then_silent(data: bytes) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(data)
        _silent(conn)
    return answer


def _endless(head: bytes, block: bytes, times: int) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(head)
        for _ in range(times):
            conn.sendall(block)
    return answer


EXPECTED_END = {"ignores max_tokens (200,000 chunks)": "length", "completion_tokens 'abc'": "eos"}


def remote_cases(timeout: float) -> dict[str, Any]:
    from ..engine.events import Done
    from ..engine.params import GenerationParams
    from ..engine.remote import RemoteEngine

    ok = _events('{"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}', "[DONE]")
    cases: list[tuple[str, Any, Callable[[socket.socket], None]]] = [
        ('models {"data": ["m"]}', {"data": ["m"]}, ok),
        ('models {"data": {"id": "m"}}', {"data": {"id": "m"}}, ok),
        ('models {"data": [null]}', {"data": [None]}, ok),
        ("event 42", MODELS, _events("42")),
        ("event [1,2]", MODELS, _events("[1, 2]")),
        ('event "x"', MODELS, _events('"x"')),
        ('event {"choices": 5}', MODELS, _events('{"choices": 5}')),
        ("a string for a choice", MODELS, _events('{"choices": ["x"]}')),
        ("a string for delta", MODELS, _events('{"choices": [{"delta": "x"}]}')),
        ("a string for usage", MODELS, _events('{"usage": "x", "choices": []}')),
        ('"content": 5', MODELS, _events('{"choices": [{"delta": {"content": 5}}]}')),
        ("completion_tokens 'abc'", MODELS, _events(
            '{"choices": [{"delta": {"content": "a"}, "finish_reason": "stop"}], "usage": {"completion_tokens": '
            '"abc"}}', "[DONE]")),
        ("an HTML page", MODELS, _then_silent(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 20"
                                              b"\r\nConnection: close\r\n\r\n<html>nginx</html>  ")),
        ("accepts, says nothing", MODELS, _silent),
        ("a status line only", MODELS, _then_silent(b"HTTP/1.1 200 OK\r\n")),
        ("stalls mid-stream", MODELS, _then_silent(SSE_HEAD + b'data: {"choices": [{"delta": {"content": "a"}}]}'
                                                   b"\n\n")),
        ("ignores max_tokens (200,000 chunks)", MODELS, _endless(
            SSE_HEAD, b'data: {"choices": [{"delta": {"content": "w"}}]}\n\n', 200_000)),
        ("a 64 MB line", MODELS, _endless(SSE_HEAD + b"data: ", b"x" * (1 << 16), 1024)),
    ]
    from ..engine import remote

    results = []
    default_read = getattr(remote, "READ_TIMEOUT_S", None)
    remote.READ_TIMEOUT_S = 2.0  # the backend's own client, with a read timeout a bench can wait for
    for name, models, answer in cases:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with hostile_server(models, answer) as url:
            def attempt(url: str = url) -> Any:
                try:
                    engine = RemoteEngine.connect(url)
                except ValueError as e:
                    return ("error", str(e))
                events = list(engine.session().reply([{"role": "user", "content": "hi"}],
                                                     GenerationParams(max_new_tokens=50)))
                done = events[-1]
                return (done.reason, done.detail) if isinstance(done, Done) else ("none", repr(done))

            state, value = _in_thread(attempt, timeout)
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
        if grown_mb > 32:
            results.append((name, "unclear", f"peak memory grew by {grown_mb:.0f} MB (unbounded)"))
        elif state == "hang":
            results.append((name, "hang", f"no end within {timeout:.0f} s"))
        elif state == "raised":
            results.append((name, "traceback", value.strip().splitlines()[-1]))
        else:
            reason, detail = value
            one_line = "\n" not in detail and len(detail) < 400
            unclear = ("invalid literal" in detail or "without a finish reason" in detail or not one_line
                       or reason != EXPECTED_END.get(name, "error"))
            results.append((name, "unclear" if unclear else "clean", f"{reason}: {detail}"))
    remote.READ_TIMEOUT_S = default_read
    out = _tally(results)
    out["data_lost"] = 0  # nothing of the user's is stored by the remote backend: a reply either ends or errs
    return out

