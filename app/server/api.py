"""`parley serve`: the in-process engine behind the OpenAI HTTP API, so editors, scripts and agents can use it.

The standard library's threading HTTP server is enough: each request gets a thread, and the engine's scheduler
decodes every running reply in one pass (continuous batching: `engine/scheduler.py`). Up to `--parallel` replies
run at once (the engine's KV slots); `--queue-size` more wait in arrival order (`EngineQueue`), and beyond that a
request gets 429 with Retry-After. A client that goes away cancels its reply, freeing its slot for the next (one
that only half-closes its socket after the request still gets it: `Handler._client_gone`); each reply takes the
slot holding the longest prefix of its prompt, so the turns of one conversation only prefill what is new.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import ipaddress
import json
import select
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from parley.engine.events import Done, Stats, TextDelta, consume
from parley.engine.params import SPECULATION_MODES, TEMPERATURE_MAX, GenerationParams
from parley.models.errors import printable

from .keys import add_key_arguments, api_key

DEFAULT_PORT = 8000
DEFAULT_QUEUE_SIZE = 8
MAX_BODY = 32 << 20  # bytes: far beyond any context window's worth of text
MAX_CHARS_PER_TOKEN = 128  # a prompt longer than this many characters per window token cannot fit: refused untokenized
SOCKET_TIMEOUT_S = 30.0  # a client silent this long mid-request (or not reading its reply) is dropped
MAX_CONNECTIONS = 64  # open connections; more are answered 503 at once (each holds a thread)
OWNED_BY = "parley"  # what GET /v1/models says, so Parley's own client knows which extra fields it may send


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from parley.app import cli

    cli.add_model_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    add_key_arguments(parser, "require `Authorization: Bearer KEY` on every request")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="also answer requests whose Host header is NAME (a DNS name this server is reached "
                             "by); by default only the addresses it binds, so a web page cannot reach it through "
                             "DNS rebinding")
    parser.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                        help="let web pages of ORIGIN (such as http://localhost:3000) call the API; by default a "
                             "request from any web page (an Origin header) is refused")
    parser.add_argument("--queue-size", type=int, default=DEFAULT_QUEUE_SIZE,
                        help="requests that may wait while --parallel replies run; more get 429 "
                             f"(default {DEFAULT_QUEUE_SIZE})")


def run(args: argparse.Namespace) -> int:
    from parley.app.engine_from_args import engine_from_args

    if args.queue_size < 0:
        raise ValueError(f"--queue-size {args.queue_size}: expected 0 or a positive integer")
    args.api_key = api_key(args)
    for origin in args.allow_origin:
        if origin != origin.strip().rstrip("/") or "://" not in origin:
            raise ValueError(f"--allow-origin {origin!r}: expected an origin such as http://localhost:3000")
    engine = engine_from_args(args)
    try:
        server = make_server(engine, args.host, args.port, api_key=args.api_key, queue_size=args.queue_size,
                             allow_hosts=args.allow_host, allow_origins=args.allow_origin)
    except OSError as e:
        raise ValueError(f"cannot listen on {args.host}:{args.port} ({e.strerror}); pick another --port") from None
    host, port = server.server_address[:2]
    print(f"parley serve: {engine.model_name} on http://{host}:{port}/v1 ({parallel_of(engine)} replies at once, "
          f"queue {args.queue_size}{', API key required' if args.api_key else ''}); Ctrl+C stops", file=sys.stderr)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print("parley serve: warning: listening beyond this machine without --api-key", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def make_server(engine: Any, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, api_key: str | None = None,
                queue_size: int = DEFAULT_QUEUE_SIZE, log: Callable[[str], None] | None = None,
                timeout: float = SOCKET_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
                allow_hosts: list[str] = (), allow_origins: list[str] = ()) -> ParleyServer:
    """A bound server (port 0 picks a free one); call `serve_forever()` (in a thread, for tests)."""
    return ParleyServer((host, port), engine, api_key=api_key, queue_size=queue_size, log=log, timeout=timeout,
                        max_connections=max_connections, allow_hosts=allow_hosts, allow_origins=allow_origins)


def host_names(bound: str, extra: Iterable[str] = ()) -> Callable[[str], bool]:
    """Whether a Host header's name is one this server is reached by: the address it binds (any of this
    machine's when it binds all of them), `localhost` for a loopback or wildcard bind, and `extra`.

    A web page can make a browser send requests here only under its own name (DNS rebinding points that name
    at 127.0.0.1), never under an IP address literal or `localhost`: checking the name shuts it out."""
    extra = {n.lower().rstrip(".") for n in extra}
    try:
        ip = ipaddress.ip_address(bound)
    except ValueError:
        ip = None
    wildcard = ip is not None and ip.is_unspecified
    names = {bound.lower(), *extra}
    if ip is None or ip.is_loopback or wildcard:
        names |= {"localhost", "127.0.0.1", "::1"}
    if wildcard:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}

    def ok(name: str) -> bool:
        name = name.lower().rstrip(".")
        if name in names:
            return True
        if wildcard:
            try:
                ipaddress.ip_address(name)
                return True
            except ValueError:
                return False
        return False
    return ok


def split_host(value: str) -> str | None:
    """The name of a Host header (`name`, `name:port`, `[v6]:port`); None when it is not one."""
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        return name if sep and (not rest or (rest[0] == ":" and rest[1:].isdigit())) else None
    name, _, port = value.partition(":")
    if not name or (port and not port.isdigit()) or ":" in port:
        return None
    return name


class RequestError(Exception):
    """A bad request: the HTTP status, the message, and the field it names."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.param, self.status, self.kind = param, status, kind


def parallel_of(engine: Any) -> int:
    """How many replies the engine runs at once: its KV slots (`Engine.parallel`); 1 for an engine without them."""
    return max(1, int(getattr(engine, "parallel", 1) or 1))


class EngineQueue:
    """Admission to the engine: up to `parallel` requests run at once (the engine's KV slots: each running reply
    holds one, and the engine decodes them together), at most `size` more wait in arrival order, and a request
    beyond that is refused (429, Retry-After) before its prompt is even tokenized.

    Kept beside the engine's scheduler for what an HTTP server needs: arrival order, a bound on waiting requests,
    and dropping a request whose client left while it waited, before it ever reaches the engine. A finished or
    cancelled reply frees its place at once (`release`), and the first waiting request takes it.
    """

    def __init__(self, size: int, parallel: int = 1) -> None:
        self.size, self.parallel = size, parallel
        self._cond = threading.Condition()
        self._waiting: deque[object] = deque()
        self._running = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return self._running

    @property
    def busy(self) -> bool:
        return self._running > 0

    def join(self) -> object:
        with self._cond:
            if len(self._waiting) >= self.size and (self._running >= self.parallel or self._waiting):
                raise RequestError(f"the server is busy: {self._running} replies run (parley serve --parallel) and "
                                   f"{len(self._waiting)} request(s) already wait (--queue-size); retry later",
                                   status=429, kind="rate_limit_error")
            ticket = object()
            self._waiting.append(ticket)
            return ticket

    def leave(self, ticket: object) -> None:
        with self._cond:
            self._waiting.remove(ticket)
            self._cond.notify_all()

    def wait_turn(self, ticket: object, gone: Callable[[], bool]) -> bool:
        """Block until `ticket` is at the head and a slot is free; False if the client left meanwhile."""
        with self._cond:
            while self._running >= self.parallel or self._waiting[0] is not ticket:
                if gone():
                    self._waiting.remove(ticket)
                    self._cond.notify_all()
                    return False
                self._cond.wait(0.1)  # wake now and then to notice a client that went away
            self._waiting.popleft()
            self._running += 1
            self._cond.notify_all()  # the next in line may run too, if a slot is left
            return True

    def release(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()


class ParleyServer(ThreadingHTTPServer):
    daemon_threads = True
    # The listen backlog: clients that connect in a burst (several tabs or scripts at once) wait in the kernel's
    # queue until accepted; past socketserver's default of 5, a busy accept loop let the kernel drop their
    # handshakes, which clients retry only after a second.
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, address: tuple[str, int], engine: Any, *, api_key: str | None, queue_size: int,
                 log: Callable[[str], None] | None, timeout: float = SOCKET_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, allow_hosts: Iterable[str] = (),
                 allow_origins: Iterable[str] = ()) -> None:
        self.engine = engine
        self.host_ok = host_names(address[0], allow_hosts)
        self.allow_origins = set(allow_origins)
        self.timeout_s = timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        self.api_key = api_key
        self.queue = EngineQueue(queue_size, parallel_of(engine))
        write = log or (lambda line: print(line, file=sys.stderr))
        self.log = lambda line: write(printable(line))  # request lines and client text carry terminal escapes
        self.created = int(time.time())
        # The latest replies' outcomes ("stop", "length", "cancelled", "error"), oldest first: for tests and logs.
        self.finished: deque[str] = deque(maxlen=256)
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Every connection holds a thread: past `max_connections` open ones, answer 503 at once and close."""
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\n\r\n")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line, never a traceback: a client that resets its connection is routine."""
        exc = sys.exc_info()[1]
        self.log(f"{client_address[0]} connection ended: {type(exc).__name__}: {exc}")


class Handler(BaseHTTPRequestHandler):
    server: ParleyServer
    protocol_version = "HTTP/1.1"
    server_version = "parley"

    def setup(self) -> None:
        self.timeout = self.server.timeout_s  # every read and write on the socket; a silent client is dropped
        super().setup()

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (ConnectionError, TimeoutError):  # a reset keep-alive connection, a client gone silent
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # the request line only: never headers (the key)
        self.server.log(f"{self.address_string()} {format % args}")

    # -- routing ----------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._handle(lambda: self._get())

    def do_POST(self) -> None:
        self._handle(lambda: self._post())

    def do_OPTIONS(self) -> None:  # a browser's CORS preflight: answered for --allow-origin pages only
        self._handle(lambda: self._preflight())

    def _handle(self, route: Callable[[], None]) -> None:
        self._body_read = self.command == "GET"
        self._streaming = False  # once the SSE headers are out, an error can only end the stream
        self._gone = self._probed = False  # see _client_gone
        self._origin: str | None = None  # an allowed Origin, echoed in Access-Control-Allow-Origin
        self._framed = False  # the body's end is known (one Content-Length, no Transfer-Encoding)
        try:
            self._check_framing()
            self._check_origin()
            if self.command != "OPTIONS":
                self._authorize()
            route()
        except RequestError as e:
            if not self._body_read:  # its body is still in the socket: drain a small one, else close
                length = self._content_length()
                if self._framed and 0 <= length <= 1 << 20:
                    self.rfile.read(length)
                    self._body_read = True
                else:
                    self.close_connection = True
            self._send_json({"error": {"message": str(e), "type": e.kind, "param": e.param, "code": None}},
                            e.status)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as e:  # the server outlives anything one request hits; its details stay in the log
            self.server.log(f"error: {type(e).__name__}: {e}")
            self.close_connection = True
            if self._streaming:
                return
            self._send_json({"error": {"message": "internal error: the server could not answer this request "
                                       "(the details are in its log)", "type": "server_error", "param": None,
                                       "code": None}}, 500)

    def _check_framing(self) -> None:
        """One reading of where the request ends, or none: a body framed two ways (Transfer-Encoding and
        Content-Length, two Content-Lengths) is read one way here and another by a proxy in front, and the rest
        would run as a second, smuggled request. The connection closes after the refusal."""
        headers = self.headers
        if headers.get_all("Transfer-Encoding"):
            self.close_connection = True
            raise RequestError("Transfer-Encoding is not accepted: send the body with a Content-Length",
                               "Transfer-Encoding", status=501)
        lengths = headers.get_all("Content-Length") or []
        if len(lengths) > 1 or (lengths and not lengths[0].strip().isdigit()):
            self.close_connection = True
            raise RequestError("Content-Length: expected one header, the body's size in bytes (0 or more)",
                               "Content-Length")
        self._framed = True  # from here a refusal may read the body away (and the client reads the answer)
        if self.command == "GET" and self._content_length():
            self.close_connection = True  # its body is not read: it must not be taken for the next request
        hosts = headers.get_all("Host") or []
        name = split_host(hosts[0].strip()) if len(hosts) == 1 else None
        if name is None or not self.server.host_ok(name):
            self.close_connection = True
            raise RequestError(f"Host {printable(hosts[0] if hosts else '', 80)!r} is not an address of this "
                               "server: send one Host header naming the address it listens on (parley serve "
                               "--allow-host NAME adds a name)", "Host", status=403, kind="permission_error")

    def _content_length(self) -> int:
        value = (self.headers.get_all("Content-Length") or ["0"])[0].strip()
        return int(value) if value.isdigit() else -1

    def _check_origin(self) -> None:
        """A request from a web page (it carries Origin) runs only for a page of --allow-origin: any site may
        otherwise POST here from a visitor's browser."""
        origins = self.headers.get_all("Origin") or []
        if not origins:
            return
        if len(origins) > 1 or origins[0] not in self.server.allow_origins:
            self.close_connection = True
            raise RequestError(f"requests from web pages ({printable(origins[0], 80)!r}) are refused: start the "
                               "server with --allow-origin ORIGIN to let that page call it", "Origin", status=403,
                               kind="permission_error")
        self._origin = origins[0]

    def _preflight(self) -> None:
        if self._origin is None:
            raise RequestError("OPTIONS answers a browser's preflight only (with an Origin header)", status=405)
        self.send_response(204)
        self.send_header("Access-Control-Allow-Methods", "GET, POST")
        self.send_header("Access-Control-Allow-Headers", "Authorization, Content-Type")
        self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def end_headers(self) -> None:
        if getattr(self, "_origin", None):
            self.send_header("Access-Control-Allow-Origin", self._origin)
            self.send_header("Vary", "Origin")
        super().end_headers()

    def _authorize(self) -> None:
        key = self.server.api_key
        if key is None:
            return
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise RequestError("missing or wrong API key: send `Authorization: Bearer KEY`", status=401,
                               kind="authentication_error")

    def _get(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        engine = self.server.engine
        if path in ("/v1/models", "/models"):
            self._send_json({"object": "list", "data": [{
                "id": engine.model_name, "object": "model", "created": self.server.created, "owned_by": OWNED_BY,
                "max_model_len": engine.context_window,
            }]})
        elif path == "/health":
            queue = self.server.queue
            self._send_json({"status": "ok", "running": queue.running, "waiting": queue.waiting,
                             "parallel": queue.parallel})
        else:
            raise RequestError(f"no route GET {path}: try GET /v1/models", status=404, kind="not_found_error")

    def _post(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        chat = path in ("/v1/chat/completions", "/chat/completions")
        if not chat and path not in ("/v1/completions", "/completions"):
            raise RequestError(f"no route POST {path}: try /v1/chat/completions or /v1/completions", status=404,
                               kind="not_found_error")
        kind = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if kind != "application/json":  # a form or text/plain body is what any web page may send unasked
            raise RequestError(f"Content-Type {printable(kind, 60)!r}: send the body as application/json",
                               "Content-Type", status=415)
        body = self._read_json()
        request = parse_request(body, self.server.engine, chat)
        self._serve(request)

    # -- one completion ---------------------------------------------------------------------------

    def _serve(self, req: CompletionRequest) -> None:
        queue = self.server.queue
        ticket = queue.join()  # the prompt is tokenized only once admitted: a flood is refused untokenized
        try:
            check_length(req, self.server.engine)
        except BaseException:
            queue.leave(ticket)
            raise
        if not queue.wait_turn(ticket, self._client_gone):
            self.close_connection = True
            self.server.finished.append("cancelled")
            return
        cancel = threading.Event()
        released = threading.Lock()

        def release() -> None:  # once: when the engine's reply ends, or when this request does if sooner
            if released.acquire(blocking=False):
                queue.release()

        try:
            events = self._generate(req, cancel, release)
            if req.stream:
                self._stream(req, events, cancel)
            else:
                self._whole(req, events, cancel)
        finally:
            cancel.set()
            release()

    def _generate(self, req: CompletionRequest, cancel: threading.Event,
                  ended: Callable[[], None]) -> Iterator[TextDelta | Stats | Done]:
        """The engine's events with stop strings applied: text up to a stop string, then Done("eos"). `ended` is
        called as soon as the engine's reply ends (its slot is free), which may be before this client has read
        all of it: the next waiting request runs meanwhile."""

        engine = self.server.engine
        if req.prompt is not None:  # raw text: the same loop over a tokenizer that takes the text as it is
            session = engine.session(raw=True)
            messages = [{"role": "user", "content": req.prompt}]
        else:
            session, messages = engine.session(None), req.messages
        matcher = StopMatcher(req.stop)
        if hasattr(session, "start"):  # the in-process engine: its reply says when it frees its slot
            stream = session.start(messages, req.params, cancel)
            if stream.job is not None:
                stream.job.on_end(ended)
            replies: Iterable = stream
        else:
            replies = session.reply(messages, req.params, cancel)
        for ev in replies:
            if isinstance(ev, TextDelta):
                text, stopped = matcher.push(ev.text)
                if text:
                    yield TextDelta(text)
                if stopped:
                    cancel.set()  # the engine stops at its next round; text it yields past here is dropped
            elif isinstance(ev, Done):
                if matcher.stopped:
                    ev = Done("eos", "stop string")
                else:
                    tail = matcher.flush()
                    if tail:
                        yield TextDelta(tail)
                yield ev
                return
            else:
                yield ev

    def _whole(self, req: CompletionRequest, events: Iterator, cancel: threading.Event) -> None:
        def watched() -> Iterator[TextDelta | Stats | Done]:
            for ev in events:  # a client that closed its socket stops the reply; one that half-closed does not
                if not cancel.is_set() and self._client_gone():
                    cancel.set()
                yield ev

        reply = consume(watched())
        stats, done = reply.stats, reply.done or Done("error", "no reply")
        self.server.finished.append(_outcome(done))
        if done.reason == "cancelled":
            self.close_connection = True
            return
        if done.reason == "error":
            raise RuntimeError(done.detail)  # logged; the client gets a 500 without the internal text
        content = reply.text
        choice: dict[str, Any] = {"index": 0, "finish_reason": _finish_reason(done), "logprobs": None}
        if req.chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice["text"] = content
        self._send_json({**req.header(), "choices": [choice], "usage": usage(stats)})

    def _stream(self, req: CompletionRequest, events: Iterator, cancel: threading.Event) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the body ends when the connection does
        self.end_headers()
        self.close_connection = self._streaming = True
        include_usage = req.include_usage
        header = req.header(chunk=True)
        stats, done = None, Done("error", "no reply")

        def send(choice: dict[str, Any] | None, **extra: Any) -> None:
            data = {**header, "choices": [{"index": 0, **choice}] if choice else [], **extra}
            if include_usage and "usage" not in extra:
                data["usage"] = None
            self._write(f"data: {json.dumps(data)}\n\n")

        batch, said = 1, 1  # replies sharing the engine's passes: told with the next text when it changes

        try:
            if req.chat:
                send({"delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None})
            for ev in events:
                if self._client_gone():
                    cancel.set()
                if isinstance(ev, TextDelta):
                    piece = {"delta": {"content": ev.text}} if req.chat else {"text": ev.text}
                    extra = {"parley": {"batch": batch}} if batch != said else {}
                    send({**piece, "finish_reason": None, "logprobs": None}, **extra)
                    said = batch
                elif isinstance(ev, Stats):
                    stats, batch = ev, ev.batch
                elif isinstance(ev, Done):
                    done = ev
            if done.reason == "cancelled":
                return
            if done.reason == "error":
                self.server.log(f"error: {done.detail}")
                self._write("data: " + json.dumps({"error": {"message": "internal error: the reply failed (the "
                                                             "details are in the server's log)",
                                                             "type": "server_error"}}) + "\n\n")
            else:
                end = {"delta": {}} if req.chat else {"text": ""}
                send({**end, "finish_reason": _finish_reason(done), "logprobs": None})
                if include_usage:
                    send(None, usage=usage(stats))
            self._write("data: [DONE]\n\n")
        except (ConnectionError, TimeoutError):
            cancel.set()
            for ev in events:  # let the engine see the cancel and finish its round
                if isinstance(ev, Done):
                    done = ev
        finally:
            self.server.finished.append(_outcome(done))

    # -- the socket -------------------------------------------------------------------------------

    def _client_gone(self) -> bool:
        """True once the client is known to be gone: its socket reports an error (a reset, a broken pipe).

        An end of input alone is not enough: a client may half-close (shutdown(SHUT_WR)) after its request
        and still read the answer, and on the wire that looks just like a client that closed its socket. So
        on the first end of input, before any answer went out, an HTTP/1.1 client is sent an interim
        `100 Continue` (every client must skip 1xx answers before the final one): a half-closed client reads
        past it, a closed socket answers it with a reset, which a later check sees. Once streaming, the
        stream's own writes draw that reset. Without a probe (HTTP/1.0) an end of input is taken as a half-close."""
        if self._gone:
            return True
        try:
            # After an end of input a reset shows only as the socket's pending error, reported once.
            if self.connection.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._gone = True
                return True
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable or self.connection.recv(1, socket.MSG_PEEK) != b"":
                return False
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            self._gone = True
            return True
        if not self._probed and not self._streaming and self.request_version == "HTTP/1.1":
            self._probed = True
            try:
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            except OSError:
                self._gone = True
        return self._gone

    def _write(self, text: str) -> None:
        self.wfile.write(text.encode())
        self.wfile.flush()

    def _read_json(self) -> dict[str, Any]:
        length = self._content_length()
        if length < 0:
            raise RequestError("Content-Length: expected the body's size in bytes (0 or more)", "Content-Length")
        if length > MAX_BODY:
            raise RequestError(f"the body is {length} bytes; at most {MAX_BODY} are accepted", "body", status=413)
        self._body_read = True  # read now, or the connection closes: a refusal must not read it again
        try:
            raw = self.rfile.read(length) if length else b""
        except TimeoutError:
            self.close_connection = True
            raise RequestError(f"the body did not arrive within {self.server.timeout_s:g} s of silence "
                               f"(Content-Length {length}); send the whole body", "body", status=408) from None
        if len(raw) < length:
            self.close_connection = True
            raise RequestError(f"the body ended after {len(raw)} of its {length} bytes (Content-Length)", "body")
        try:
            body = json.loads(raw)
        except RecursionError:
            raise RequestError("the body nests arrays/objects too deeply to parse; send a flat JSON object",
                               "body") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"the body is not valid JSON ({str(e)[:80]}); send a JSON object", "body") from None
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object", "body")
        return body

    def _send_json(self, data: dict[str, Any], status: int = 200) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status, HTTPStatus(status).phrase)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if status == 429:
            self.send_header("Retry-After", "1")
        if self.close_connection:  # say so, or a keep-alive client would send its next request into it
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()


# -- requests ---------------------------------------------------------------------------------------


class CompletionRequest:
    """A validated request: what to generate from, with which parameters, and how to answer."""

    def __init__(self, *, chat: bool, model: str, params: GenerationParams, stream: bool, include_usage: bool,
                 stop: list[str], messages: list[dict[str, str]] | None = None, prompt: str | None = None) -> None:
        self.chat, self.model, self.params, self.stream = chat, model, params, stream
        self.include_usage, self.stop, self.messages, self.prompt = include_usage, stop, messages, prompt
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def header(self, chunk: bool = False) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": kind + (".chunk" if chunk and self.chat else ""),
                "created": self.created, "model": self.model}


def parse_request(body: dict[str, Any], engine: Any, chat: bool) -> CompletionRequest:
    """Check every field we use; a RequestError names the first bad one."""
    model = body.get("model", engine.model_name)
    if model != engine.model_name:
        raise RequestError(f"model {model!r} is not served here: this server serves {engine.model_name!r} "
                           "(GET /v1/models)", "model")
    if body.get("n", 1) != 1:
        raise RequestError("n: only n=1 is supported (one engine, one reply)", "n")
    params = GenerationParams(temperature=1.0, top_p=1.0)  # the OpenAI API's defaults
    _number(body, "temperature", params, 0.0, TEMPERATURE_MAX, f"between 0 and {TEMPERATURE_MAX:g} (0 = greedy)")
    _number(body, "top_p", params, 0.0, 1.0, "in (0, 1]", low_open=True)
    _number(body, "min_p", params, 0.0, 1.0, "in [0, 1)", high_open=True)
    if body.get("top_k") is not None:
        top_k = body["top_k"]
        if not _is_int(top_k) or top_k < -1:
            raise RequestError(f"top_k={top_k!r}: expected -1 or 0 (off) or a positive integer", "top_k")
        params.top_k = max(0, top_k)
    if body.get("seed") is not None:
        if not _is_int(body["seed"]):
            raise RequestError(f"seed={body['seed']!r}: expected an integer", "seed")
        params.seed = body["seed"]
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if value is not None:
            if not _is_int(value) or value < 1:
                raise RequestError(f"{field}={value!r}: expected a positive integer", field)
            params.max_new_tokens = value
            break
    else:
        params.max_new_tokens = engine.context_window  # until the model stops or the window is full
    if body.get("speculation") is not None:  # Parley's extension fields
        if body["speculation"] not in SPECULATION_MODES:
            raise RequestError(f"speculation={body['speculation']!r}: expected one of {', '.join(SPECULATION_MODES)}",
                               "speculation")
        params.speculation = body["speculation"]
    if body.get("draft_tokens") is not None:
        if not _is_int(body["draft_tokens"]) or not 1 <= body["draft_tokens"] <= 16:
            raise RequestError(f"draft_tokens={body['draft_tokens']!r}: expected 1 to 16", "draft_tokens")
        params.draft_tokens = body["draft_tokens"]
    for field, message in params.problems():  # the engine's own ranges (e.g. a seed beyond 64 bits)
        raise RequestError(message, field)

    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
        raise RequestError("stop: expected a string or a list of up to 16 non-empty strings", "stop")
    for s in stop:
        _text(s, "stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"stream={stream!r}: expected true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("stream_options: expected an object such as {\"include_usage\": true}", "stream_options")
    include_usage = bool(options.get("include_usage", False))

    if chat:
        messages = _messages(body.get("messages"))
        if body.get("continue_final_message"):  # vLLM's extension: go on with the last assistant message
            if messages[-1]["role"] != "assistant":
                raise RequestError("continue_final_message needs the last message to be the assistant's",
                                   "continue_final_message")
            _too_long(sum(len(m["content"]) for m in messages), engine, "messages")
            prompt = engine.tokenizer.render_chat(messages[:-1]) + messages[-1]["content"]
            req = CompletionRequest(chat=True, model=model, params=params, stream=stream, include_usage=include_usage,
                                    stop=stop, prompt=prompt)
        else:
            req = CompletionRequest(chat=True, model=model, params=params, stream=stream, include_usage=include_usage,
                                    stop=stop, messages=messages)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise RequestError("prompt: expected a non-empty string", "prompt")
        _text(prompt, "prompt")
        req = CompletionRequest(chat=False, model=model, params=params, stream=stream, include_usage=include_usage,
                                stop=stop, prompt=prompt)
    _too_long(len(req.prompt) if req.prompt is not None else sum(len(m["content"]) for m in req.messages),
              engine, "messages" if chat else "prompt")
    return req


def check_length(req: CompletionRequest, engine: Any) -> None:
    """Tokenize the prompt (once the request holds a place in the queue) and refuse one the window cannot hold."""
    if req.prompt is not None:
        ids, field = engine.tokenizer.encode(req.prompt), "messages" if req.chat else "prompt"
    else:
        ids, field = engine.tokenizer.encode_chat(req.messages), "messages"
    if len(ids) >= engine.context_window:
        raise RequestError(f"{field}: the prompt is {len(ids)} tokens; the context window holds "
                           f"{engine.context_window}. Shorten it.", field)


def _too_long(chars: int, engine: Any, field: str) -> None:
    """Refuse, without tokenizing, a prompt too long for the window at any plausible characters per token."""
    if chars > MAX_CHARS_PER_TOKEN * engine.context_window:
        raise RequestError(f"{field}: the prompt is {chars:,} characters; the context window holds "
                           f"{engine.context_window} tokens. Shorten it.", field)


def _text(value: str, field: str) -> str:
    """Text the tokenizer can take: JSON's \\u escapes can carry lone surrogates, which are not Unicode text."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"{field}: character {e.start} is a lone surrogate ({value[e.start]!r}), not text; "
                           "send valid UTF-8", field) from None
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict[str, Any], name: str, params: GenerationParams, low: float, high: float, expected: str,
            low_open: bool = False, high_open: bool = False) -> None:
    value = body.get(name)
    if value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        raise RequestError(f"{name}={value!r} is out of range: expected {expected}", name)
    setattr(params, name, float(value))


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise RequestError("messages: expected a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise RequestError(f"messages[{i}].role: expected system, user or assistant", f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported",
                                   f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content: expected a string", f"messages[{i}].content")
        _text(content, f"messages[{i}].content")
        out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    return out


# -- answers ----------------------------------------------------------------------------------------


def usage(stats: Stats | None) -> dict[str, Any]:
    """OpenAI's usage, the reused prefix as `cached_tokens`, and Parley's own figures under `parley`."""
    if stats is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    prompt = stats.prompt_tokens + stats.reused_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": stats.new_tokens,
        "total_tokens": prompt + stats.new_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.reused_tokens},
        "parley": {
            "accepted": stats.accepted, "proposed": stats.proposed,
            "acceptance_rate": round(stats.acceptance_rate, 4),
            "tokens_per_target_pass": round(stats.tokens_per_target_pass, 4), "drafter": stats.drafter,
            "tokens_per_s": round(stats.tokens_per_s, 2), "ttft_s": round(stats.ttft_s, 4),
            "kv_cache": stats.kv_cache, "step": stats.step, "batch": stats.batch,
        },
    }


def _finish_reason(done: Done) -> str:
    return "length" if done.reason == "length" else "stop"


def _outcome(done: Done) -> str:
    return done.reason if done.reason in ("cancelled", "error") else _finish_reason(done)


class StopMatcher:
    """Cuts streamed text at the first stop string, holding back a tail that may be the start of one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.held = ""
        self.stopped = False

    def push(self, text: str) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string was reached)."""
        if self.stopped:
            return "", True
        if not self.stops:
            return text, False
        buf = self.held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return buf[: min(hits)], True
        keep = max((k for s in self.stops for k in range(1, len(s)) if buf.endswith(s[:k])), default=0)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held
