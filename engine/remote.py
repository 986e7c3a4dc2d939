"""The remote backend: chat with a model served over the OpenAI API (vLLM, SGLang, llama-server, Ollama, parley serve).

Plain `httpx` with a few lines of server-sent-events parsing, not the `openai` client: we send fields the
official client has no names for (top_k, min_p, continue_final_message), read fields it drops (llama-server's
`timings`, Parley's `usage.parley`), and close the stream the moment the user presses Esc.

What each server accepts is decided once, at connect time, from `GET /v1/models` (`owned_by`), the `Server`
header and, when those are silent, a cheap `GET /api/version` (only Ollama answers it); see `SERVERS`.
"""

from __future__ import annotations

import ipaddress
import json
import math
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..models.errors import printable
from .events import Done, Event, Notice, Stats, TextDelta
from .params import GenerationParams
from .protocol import Capabilities
from .reply_stats import ReplyStats

DEFAULT_CONTEXT = 4096  # when the server does not say and no --context-window is given
# Every read from the server is bounded, in time and in size (names read at call time: tests lower them).
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 300.0  # a server silent this long (no headers, no event) is taken as stuck: a long prefill fits
PROGRESS_TIMEOUT_S = 300.0  # headers, then each piece of text, within this: keep-alives alone do not count
PROBE_TIMEOUT_S = 60.0  # a whole GET (/v1/models, /props, /api/version), headers and body
REPLY_TIMEOUT_S = 7200.0  # one whole streamed answer
MAX_LINE = 1 << 20  # bytes in one event-stream line (and in one event's data); an OpenAI chunk is a few hundred
MAX_JSON = 8 << 20  # bytes of a GET's JSON answer (a model list)
MAX_QUIET_LINES = 10_000  # lines in a row that carry no event (comments, unknown fields) before giving up
MAX_QUIET_EVENTS = 10_000  # events in a row that carry no text ({} or empty deltas) before giving up
OPENAI_FIELDS = ("temperature", "top_p", "max_new_tokens")  # every server takes these
SPECULATION = ("speculation", "draft_tokens")  # Parley's own: only parley serve takes them


@dataclass(frozen=True)
class Server:
    """What one kind of server honours."""

    name: str
    extra: tuple[str, ...]  # of top_k, min_p, seed, speculation, draft_tokens: sent as extra body fields
    continue_final: bool  # chat completions continue a last assistant message (continue_final_message)
    raw_completions: bool  # /v1/completions takes the prompt as it is (no template applied server-side)
    speculation: bool = False  # reports speculative acceptance
    note: str = ""  # why a field is ignored


SERVERS = {
    "parley": Server("parley serve", ("top_k", "min_p", "seed", *SPECULATION), True, True, speculation=True),
    "vllm": Server("vLLM", ("top_k", "min_p", "seed"), True, True),
    "sglang": Server("SGLang", ("top_k", "min_p", "seed"), True, True),
    "llamacpp": Server("llama-server", ("top_k", "min_p", "seed"), False, True, speculation=True),
    "ollama": Server("Ollama", ("seed",), False, False, note="its OpenAI endpoint ignores it"),
    "openai": Server("the server", ("seed",), False, False,
                     note="not an OpenAI field, and the server did not say it takes it"),
}


def server_kind(owned_by: str, server_header: str, ollama_version: bool) -> str:
    """Which entry of SERVERS a server is, from what it tells about itself."""
    owner, header = owned_by.lower(), server_header.lower()
    if owner in ("parley", "vllm", "sglang"):
        return owner
    if owner == "llamacpp" or "llama.cpp" in header:
        return "llamacpp"
    if ollama_version or owner in ("library", "ollama"):
        return "ollama"
    return "openai"


def insecure_warning(url: str) -> str | None:
    """One line when the API key (and the chat) would cross the network in clear text."""
    parts = urlsplit(url)
    if parts.scheme == "http" and not _loopback(parts.hostname or ""):
        return f"{parts.scheme}://{parts.hostname} is plain http: the API key and the chat travel unencrypted"
    return None


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def base_url(url: str) -> str:
    """`http://host:8000` and `http://host:8000/v1/` both mean `http://host:8000/v1`."""
    url = url.rstrip("/")
    if not urlsplit(url).scheme:
        raise ValueError(f"--server {url!r}: expected a URL such as http://127.0.0.1:8000/v1")
    return url if urlsplit(url).path else url + "/v1"


class RemoteEngine:
    """An `EngineLike` over an OpenAI-compatible server; `connect` probes it, `session().reply` streams."""

    quantization = "remote"

    def __init__(self, url: str, model: str, kind: str, context_window: int, *, api_key: str | None = None,
                 tokenizer: Any = None, client: httpx.Client | None = None) -> None:
        self.url = base_url(url)
        self.model_name = model
        self.kind = kind
        self.server = SERVERS[kind]
        self.context_window = context_window
        self.tokenizer = tokenizer  # parley Tokenizer of the served model, when the user gave one
        self._api_key = api_key  # kept only in memory, sent only as the Authorization header
        self.client = client or _client()
        self.warning = insecure_warning(self.url)  # told once, on the first reply
        self.turn = threading.Lock()  # one reply at a time (SessionLike.reply), as the in-process engine

    def __repr__(self) -> str:  # never the key
        return f"RemoteEngine({self.url!r}, model={self.model_name!r}, kind={self.kind!r})"

    @classmethod
    def connect(cls, url: str, *, api_key: str | None = None, model: str | None = None, tokenizer: Any = None,
                context_window: int | None = None, client: httpx.Client | None = None) -> RemoteEngine:
        """Ask the server what it serves and what it is; raise ValueError saying what to fix (one line, its
        text from the server with control characters escaped)."""
        try:
            return cls._connect(url, api_key=api_key, model=model, tokenizer=tokenizer,
                                context_window=context_window, client=client)
        except ValueError as e:
            raise ValueError(printable(e, 600)) from None

    @classmethod
    def _connect(cls, url: str, *, api_key: str | None, model: str | None, tokenizer: Any,
                 context_window: int | None, client: httpx.Client | None) -> RemoteEngine:
        url = base_url(url)
        client = client or _client()
        headers = _auth(api_key)
        resp = _get(client, f"{url}/models", headers)
        if resp.status_code == 401 or resp.status_code == 403:
            raise ValueError(f"{url} refused the API key ({resp.status_code}): set PARLEY_API_KEY or pass "
                             "--api-key-file")
        if resp.status_code != 200:
            raise ValueError(f"GET {url}/models answered {resp.status_code}: {_error_message(resp)}; "
                             "is this an OpenAI-compatible endpoint (it usually ends in /v1)?")
        try:
            models = json.loads(resp.content)["data"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ValueError(f"GET {url}/models did not answer an OpenAI model list") from None
        if not isinstance(models, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str)
                                                   for m in models):
            raise ValueError(f"GET {url}/models answered a malformed model list (expected \"data\": a list of "
                             "{\"id\": ...} objects); is this an OpenAI-compatible endpoint?")
        if not models:
            raise ValueError(f"{url} serves no model yet (GET /v1/models is empty)")
        if any(printable(m["id"]) != m["id"] or len(m["id"]) > 1000 for m in models):
            raise ValueError(f"GET {url}/models names a model with control characters or over 1,000 characters; "
                             "is this the server you meant?")
        card = next((m for m in models if m.get("id") == model), None) if model else models[0]
        if card is None:
            names = ", ".join(m.get("id", "?") for m in models)
            raise ValueError(f"--model {model!r} is not served by {url}; it serves: {names}")
        root = url.rsplit("/v1", 1)[0]
        owned_by = str(card.get("owned_by") or "")
        ollama = False
        if owned_by.lower() not in ("parley", "vllm", "sglang", "llamacpp"):
            probe = _get(client, f"{root}/api/version", headers, quiet=True)  # only Ollama answers this
            ollama = probe is not None and probe.status_code == 200 and "version" in _json(probe)
        kind = server_kind(owned_by, resp.headers.get("server", ""), ollama)
        window = context_window or _llamacpp_context(client, root, headers, kind) or _context_length(card)
        return cls(url, card["id"], kind, window or DEFAULT_CONTEXT, api_key=api_key, tokenizer=tokenizer,
                   client=client)

    @property
    def capabilities(self) -> Capabilities:
        server = self.server
        unsupported = {f: f"{server.name}: {server.note}" for f in ("top_k", "min_p", "seed") if f not in server.extra}
        if "speculation" not in server.extra:
            reason = f"speculative decoding is {server.name}'s own setting (set when the server starts)"
            unsupported |= {f: reason for f in SPECULATION}
        unsupported["kv_cache"] = f"the KV cache is {server.name}'s own setting (set when the server starts)"
        live = server.continue_final or (server.raw_completions and self.tokenizer is not None)
        note = "" if live else (f"{server.name} cannot continue a reply with new settings"
                                + ("" if not server.raw_completions else " without the model's tokenizer (--tokenizer)")
                                + ": a change applies from the next reply")
        return Capabilities(unsupported=unsupported, live_params=live, live_params_note=note,
                            speculation=server.speculation)

    def session(self, system_prompt: str | None = None, raw: bool = False) -> RemoteSession:
        if raw:
            raise ValueError("raw text (no chat template) continues with the local engine: leave out --server")
        return RemoteSession(self, system_prompt)

    def count_tokens(self, text: str) -> int:
        """Exact with the model's tokenizer; otherwise an estimate (about 4 characters a token)."""
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text))
        return math.ceil(len(text) / 4)

    # -- requests -----------------------------------------------------------------------------------

    def body(self, params: GenerationParams, max_tokens: int) -> dict[str, Any]:
        """Sampling fields this server honours; the standard ones always."""
        body: dict[str, Any] = {"model": self.model_name, "temperature": params.temperature, "top_p": params.top_p,
                                "max_tokens": max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}}
        extra = self.server.extra
        if "top_k" in extra and params.top_k > 0:
            body["top_k"] = params.top_k
        if "min_p" in extra and params.min_p > 0:
            body["min_p"] = params.min_p
        if "seed" in extra and params.seed is not None:
            body["seed"] = params.seed
        if "speculation" in extra:
            body |= {"speculation": params.speculation, "draft_tokens": params.draft_tokens}
        return body

    def open(self, path: str, body: dict[str, Any], deadline: Deadline | None = None
             ) -> AbstractContextManager[httpx.Response]:
        """A streaming POST; leaving the `with` closes the connection, which stops the server's generation."""
        return self.client.stream("POST", f"{self.url}{path}", json=body, headers=_headers(self._api_key),
                                  extensions={"trace": deadline.trace} if deadline else {})


class RemoteSession:
    def __init__(self, engine: RemoteEngine, system_prompt: str | None = None) -> None:
        self.engine = engine
        self.system_prompt = system_prompt

    def reply(self, messages: list[dict[str, str]], params: GenerationParams,
              cancel: threading.Event | None = None) -> Iterator[Event]:
        """Stream the answer; a live change of a sampling field restarts the request from the text so far."""
        with self.engine.turn:
            self._deadline: Deadline | None = None
            try:
                for ev in self._reply(messages, params, cancel or threading.Event()):
                    if isinstance(ev, Done):  # text from the server, shown on a terminal: escaped, one line
                        ev = Done(ev.reason, printable(ev.detail, 600))
                    elif isinstance(ev, Notice):
                        ev = Notice(printable(ev.text, 600))
                    yield ev
            except (httpx.HTTPError, ValueError) as e:
                yield Done("error", printable(self._why(e), 600))
            finally:
                if self._deadline is not None:
                    self._deadline.close()

    def _why(self, e: Exception) -> str:
        url = self.engine.url
        if self._deadline is not None and self._deadline.expired:
            return f"{url}: {self._deadline.expired}: the server is stuck or overloaded; try again or restart it"
        if isinstance(e, httpx.TimeoutException):
            return (f"{url} sent nothing for {self.engine.client.timeout.read or 0:g} s: the server is stuck or "
                    "overloaded; try again or restart it")
        if isinstance(e, httpx.HTTPError):
            return f"lost {url}: {type(e).__name__}: {e}"
        return str(e)

    def _reply(self, messages: list[dict[str, str]], live: GenerationParams,
               cancel: threading.Event) -> Iterator[Event]:
        eng = self.engine
        if eng.warning:
            yield Notice(eng.warning)
            eng.warning = None
        t0 = time.perf_counter()
        params = live.snapshot()
        params.validate()
        if self.system_prompt and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        figures = _Figures(t0, eng.context_window)
        told_not_live = False
        text = ""  # the reply so far, across requests
        finish: str | None = None
        while True:
            budget = params.max_new_tokens - figures.new_tokens
            if budget <= 0:
                finish = "length"
                break
            path, body = self._request(messages, text, params, budget)
            restart = False
            if self._deadline is not None:
                self._deadline.close()
            deadline = self._deadline = Deadline(PROGRESS_TIMEOUT_S, "no answer (status and headers)", REPLY_TIMEOUT_S)
            with eng.open(path, body, deadline) as resp:
                deadline.extend(PROGRESS_TIMEOUT_S, "no text")
                _plain(resp)
                if resp.status_code != 200:
                    why = _error_text(_read_some(resp)) or resp.reason_phrase
                    yield Done("error", f"{eng.server.name} answered {resp.status_code}: {why}")
                    return
                kind = resp.headers.get("content-type", "")
                if "html" in kind:
                    yield Done("error", f"{eng.url}{path} answered a web page ({kind}), not an event stream: "
                                        "is --server an OpenAI-compatible endpoint (it usually ends in /v1)?")
                    return
                segment, after_budget, quiet = _Segment(), 0, 0
                for data in iter_sse(sse_lines(resp.iter_raw())):
                    if cancel.is_set():
                        break  # leaving `with` closes the connection: the server stops generating
                    try:
                        chunk = json.loads(data)
                    except (ValueError, RecursionError):
                        yield Done("error", f"{eng.server.name} sent a stream event that is not JSON: {data[:80]!r}")
                        return
                    if isinstance(chunk, dict) and ("error" in chunk or chunk.get("object") == "error"):
                        yield Done("error", f"{eng.server.name}: {_message(chunk)}")
                        return
                    try:
                        piece, reason = segment.read(chunk, path)
                    except ValueError as e:
                        yield Done("error", f"{eng.server.name} sent a malformed stream event ({e}): {data[:80]!r}")
                        return
                    finish = reason or finish
                    quiet = 0 if piece or reason else quiet + 1
                    if quiet > MAX_QUIET_EVENTS:
                        raise ValueError(f"{eng.server.name} sent {MAX_QUIET_EVENTS:,} stream events in a row "
                                         "without text: the server is stuck; try again or restart it")
                    if figures.new_tokens >= params.max_new_tokens:
                        # A server that ignores max_tokens is cut off here: nothing past the budget is shown, and
                        # only a few more events are read, for the finish reason and usage that normally follow.
                        after_budget += 1
                        if after_budget > EVENTS_AFTER_BUDGET:
                            finish = finish or "length"
                            break
                        continue
                    if piece:
                        deadline.extend(PROGRESS_TIMEOUT_S, "no text")
                        text += piece
                        figures.token(segment)
                        yield TextDelta(printable(piece, lines=True))  # no terminal escapes from the server
                    if figures.due():
                        yield figures.stats()
                    changed = _changed(params, live.snapshot(), eng.server.extra)
                    if changed and finish is None:
                        if "max_new_tokens" in changed and live.max_new_tokens <= figures.new_tokens:
                            params, finish = live.snapshot(), "length"  # lowered below what is shown: done
                            break
                        if eng.capabilities.live_params:
                            params, restart = live.snapshot(), True
                            break
                        if not told_not_live:
                            told_not_live = True
                            yield Notice(eng.capabilities.live_params_note)
                figures.close(segment)
            if deadline.expired:  # the connection was cut: what ended the stream was the limit, not the server
                raise ValueError(deadline.expired)
            if cancel.is_set():
                yield figures.stats()
                yield Done("cancelled")
                return
            if restart:
                continue
            break
        yield figures.stats()
        if finish == "length":
            yield Done("length", f"max_new_tokens={params.max_new_tokens} reached")
        elif finish is None:
            yield Done("error", f"{eng.server.name} ended the stream without a finish reason")
        else:
            yield Done("eos")

    def _request(self, messages: list[dict[str, str]], text: str, params: GenerationParams,
                 budget: int) -> tuple[str, dict[str, Any]]:
        """The first request, or one that continues `text` (the reply so far) under new parameters."""
        eng = self.engine
        body = eng.body(params, budget)
        if not text:
            return "/chat/completions", {**body, "messages": messages}
        partial = [*messages, {"role": "assistant", "content": text}]
        if eng.server.continue_final:
            return "/chat/completions", {**body, "messages": partial, "continue_final_message": True,
                                         "add_generation_prompt": False}
        prompt = eng.tokenizer.render_chat(messages) + text
        return "/completions", {**body, "prompt": prompt}


EVENTS_AFTER_BUDGET = 8  # events read once max_new_tokens are shown (a finish chunk, a usage chunk, [DONE])


class _Segment:
    """One HTTP request's share of a reply: its text chunks, usage and server timings."""

    def __init__(self) -> None:
        self.chunks = 0
        self.usage: dict[str, Any] = {}
        self.timings: dict[str, Any] = {}
        self.batch = 0  # parley serve: replies sharing the engine's passes, as it last said (0: not said)

    def read(self, chunk: Any, path: str) -> tuple[str, str | None]:
        """(text, finish reason) of one chunk; ValueError naming the first field of the wrong type."""
        _expect(chunk, dict, "the event")
        if chunk.get("usage"):
            self.usage = _expect(chunk["usage"], dict, "usage")
        if chunk.get("timings"):  # llama-server
            self.timings = _expect(chunk["timings"], dict, "timings")
        extra = chunk.get("parley")  # parley serve's own figures mid-stream
        if isinstance(extra, dict) and isinstance(extra.get("batch"), int) and 0 < extra["batch"] <= 1 << 16:
            self.batch = extra["batch"]
        piece, reason = "", None
        for choice in _expect(chunk.get("choices") or [], list, "choices"):
            _expect(choice, dict, "a choice")
            if "chat" in path:
                delta = _expect(choice.get("delta") or {}, dict, "delta")
                piece += _expect(delta.get("content") or "", str, "delta.content")
            else:
                piece += _expect(choice.get("text") or "", str, "text")
            reason = _expect(choice.get("finish_reason") or reason, (str, type(None)), "finish_reason")
        if piece:
            self.chunks += 1
        return piece, reason

    @property
    def tokens(self) -> int:
        """The server's count when it gave one, else one token per chunk (what these servers stream)."""
        return _count(self.usage.get("completion_tokens")) or _count(self.timings.get("predicted_n")) or self.chunks


class _Figures(ReplyStats):
    """The status bar's figures over all requests of one reply; rates measured here, on the client."""

    def __init__(self, t0: float, window: int) -> None:
        super().__init__(window)
        self.t0 = self.t_reported = t0
        self.done_tokens = 0  # of closed segments
        self.passes = 0.0  # estimated from the server's tokens per target pass, when it reports one
        self.kv_cache = self.step = ""  # what a Parley server says its reply ran on
        self.batch = 1  # replies sharing the server's passes, as it said last

    def token(self, segment: _Segment) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()
        self.new_tokens = self.done_tokens + segment.tokens
        self.batch = segment.batch or self.batch

    def close(self, segment: _Segment) -> None:
        self.done_tokens += segment.tokens
        self.new_tokens = self.done_tokens
        usage, timings = segment.usage, segment.timings
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        self.reused_tokens = _count(details.get("cached_tokens")) or _count(timings.get("cache_n"))
        prompt = _count(usage.get("prompt_tokens")) or _count(timings.get("prompt_n")) + _count(timings.get("cache_n"))
        self.prompt_tokens = max(0, prompt - self.reused_tokens)
        # the last request's prompt (which holds the earlier segments' text) and its output
        self.context_tokens = prompt + segment.tokens if prompt else 0
        spec = usage.get("parley") or {}
        if isinstance(spec, dict) and spec:
            self.accepted += _count(spec.get("accepted"))
            self.proposed += _count(spec.get("proposed"))
            self.drafter = str(spec.get("drafter", ""))[:80]
            self.kv_cache, self.step = str(spec.get("kv_cache", ""))[:16], str(spec.get("step", ""))[:16]
            batch = spec.get("batch")
            self.batch = batch if isinstance(batch, int) and 0 < batch <= 1 << 16 else self.batch
            rate = spec.get("tokens_per_target_pass")
            rate = float(rate) if isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0 else 0
            self.passes += segment.tokens / rate if rate else 0
        elif "draft_n" in timings:  # llama-server with a draft model
            self.accepted += _count(timings.get("draft_n_accepted"))
            self.proposed += _count(timings["draft_n"])
            self.drafter = "llama-server draft"

    def stats(self) -> Stats:
        """As a local reply's, except: a server that says nothing about speculation made one token per
        pass, and one that gives no prompt count still has the reply's own tokens in context."""
        s = super().stats()
        n = self.new_tokens
        return replace(s, tokens_per_target_pass=s.tokens_per_target_pass or (1.0 if n else 0.0),
                       context_tokens=s.context_tokens or n, kv_cache=self.kv_cache, step=self.step,
                       batch=self.batch)


def sse_lines(chunks: Iterable[bytes], max_line: int = MAX_LINE) -> Iterator[str]:
    """The lines of an event stream (LF or CRLF ends), none longer than `max_line` bytes: a server cannot make
    the client hold an endless line in memory."""
    pending = b""
    for chunk in chunks:
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if len(line) > max_line:
                break
            yield line.removesuffix(b"\r").decode("utf-8", "replace")
        if len(pending) > max_line or any(len(line) > max_line for line in lines):
            raise ValueError(f"the server sent an event-stream line of over {max_line:,} bytes")
    if pending:
        yield pending.removesuffix(b"\r").decode("utf-8", "replace")


def iter_sse(lines: Iterable[str]) -> Iterator[str]:
    """The `data` of each server-sent event, until `[DONE]`; comments and other fields are skipped (at most
    MAX_QUIET_LINES in a row: a stream of keep-alives alone is a stuck server)."""
    data: list[str] = []
    quiet = size = 0
    for line in lines:
        quiet = 0 if line.startswith("data:") else quiet + 1
        if quiet > MAX_QUIET_LINES:
            raise ValueError(f"the server sent {MAX_QUIET_LINES:,} event-stream lines in a row without data")
        if line == "":
            if data:
                payload = "\n".join(data)
                data, size = [], 0
                if payload.strip() == "[DONE]":
                    return
                yield payload
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            size += len(data[-1]) + 1
            if size > MAX_LINE:  # data lines without the blank line that ends an event
                raise ValueError(f"the server sent a stream event of over {MAX_LINE:,} bytes (data lines without "
                                 "the blank line that ends an event)")
    if data and "\n".join(data).strip() != "[DONE]":
        yield "\n".join(data)


def _changed(sent: GenerationParams, now: GenerationParams, extra: tuple[str, ...]) -> set[str]:
    """The fields the server honours that differ (a new seed mid-reply means nothing, so it is not one)."""
    honoured = [*OPENAI_FIELDS, *(f for f in extra if f != "seed")]
    return {f for f in honoured if getattr(sent, f) != getattr(now, f)}


def _client() -> httpx.Client:
    return httpx.Client(timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S))


class Deadline:
    """Cuts a request's connection when a time limit passes, from a watching thread.

    httpx's timeouts bound each read; they do not bound a status line sent a byte a minute, nor a stream of
    keep-alive comments that never says anything. Here the request's socket (seen through httpx's `trace`
    extension as it connects; requests say `Connection: close`, so none reuses a socket) is shut down once
    `extend`'s deadline, or the whole request's `total`, passes; the read then ends and `expired` says why."""

    def __init__(self, seconds: float, what: str, total: float) -> None:
        self._cond = threading.Condition()
        self._end = time.monotonic() + total
        self._total = total
        self._sockets: list[socket.socket] = []
        self._closed = False
        self.expired = ""
        self.extend(seconds, what)
        threading.Thread(target=self._watch, daemon=True).start()

    def extend(self, seconds: float, what: str) -> None:
        """The next deadline: `seconds` from now, for `what` (cheap: the watcher reads it when it wakes)."""
        self._seconds, self._what = seconds, what
        self._at = min(time.monotonic() + seconds, self._end)

    def trace(self, name: str, info: dict[str, Any]) -> None:
        if name == "connection.connect_tcp.complete":
            sock = info["return_value"].get_extra_info("socket")
            if sock is not None:
                with self._cond:
                    self._sockets.append(sock)

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                left = self._at - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                whole = self._at >= self._end
                self.expired = (f"the whole answer took over {self._total:g} s" if whole else
                                f"{self._what} for {self._seconds:g} s")
                for sock in self._sockets:
                    with suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                return

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _headers(api_key: str | None) -> dict[str, str]:
    """Every request: the key, no compression (a gzip bomb inflates 1000-fold) and a fresh connection."""
    return {**_auth(api_key), "Accept-Encoding": "identity", "Connection": "close"}


def _plain(resp: httpx.Response) -> None:
    """Refuse an answer compressed though none was asked for: it is read raw, never inflated."""
    encoding = resp.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ValueError(f"{resp.request.url} answered compressed ({printable(encoding, 40)}) though asked for "
                         "no compression (Accept-Encoding: identity); is a proxy in between?")


def _expect(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(value, kind):
        raise ValueError(f"{what} is a {type(value).__name__}")
    return value


def _count(value: Any) -> int:
    """A token count from the server's figures; anything but a non-negative integer counts as unknown (0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _read_some(resp: httpx.Response, limit: int = 1 << 16) -> bytes:
    """Up to `limit` bytes of an answer, raw (an endless one is cut)."""
    body = b""
    for chunk in resp.iter_raw():
        body += chunk
        if len(body) >= limit:
            break
    return body[:limit]


def _error_text(raw: bytes) -> str:
    try:
        return _message(json.loads(raw))
    except (ValueError, RecursionError):
        return raw[:200].decode("utf-8", "replace")


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _get(client: httpx.Client, url: str, headers: dict[str, str], quiet: bool = False) -> httpx.Response | None:
    """A GET read whole within PROBE_TIMEOUT_S and MAX_JSON bytes; its body is in `.content`."""
    deadline = Deadline(PROBE_TIMEOUT_S, "no whole answer", PROBE_TIMEOUT_S)
    try:
        with client.stream("GET", url, headers={**headers, "Accept-Encoding": "identity", "Connection": "close"},
                           extensions={"trace": deadline.trace}) as resp:
            _plain(resp)
            body = _read_some(resp, MAX_JSON + 1)
            if deadline.expired:
                raise ValueError(deadline.expired)
            if len(body) > MAX_JSON:
                raise ValueError(f"its answer is over {MAX_JSON:,} bytes")
            return httpx.Response(resp.status_code, headers=resp.headers, content=body, request=resp.request)
    except (httpx.HTTPError, ValueError) as e:
        if quiet:
            return None
        if deadline.expired or isinstance(e, ValueError):
            raise ValueError(f"GET {url}: {deadline.expired or e}; is it an OpenAI-compatible endpoint that "
                             "works?") from None
        if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
            raise ValueError(f"cannot reach {url} ({type(e).__name__}: {e}); is the server running?") from None
        raise ValueError(f"GET {url} failed ({type(e).__name__}: {e}); is it an OpenAI-compatible endpoint that "
                         "works?") from None
    finally:
        deadline.close()


def _json(resp: httpx.Response) -> Any:
    try:
        return json.loads(resp.content)
    except (ValueError, RecursionError):
        return {}


def _message(body: Any) -> str:
    """The error text of any of these servers' error bodies."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    return str(body)


def _error_message(resp: httpx.Response) -> str:
    body = _json(resp)
    return _message(body) if body else (resp.text[:200] or resp.reason_phrase)


def _context_length(card: dict[str, Any]) -> int | None:
    """vLLM, SGLang and parley serve: `max_model_len`; llama-server: `meta.n_ctx_train` (the trained length,
    used only when its `/props` does not give the running `n_ctx`)."""
    meta = card.get("meta")
    value = card.get("max_model_len") or (meta.get("n_ctx_train") if isinstance(meta, dict) else None)
    return _count(value) or None


def _llamacpp_context(client: httpx.Client, root: str, headers: dict[str, str], kind: str) -> int | None:
    if kind != "llamacpp":
        return None
    resp = _get(client, f"{root}/props", headers, quiet=True)
    body = _json(resp) if resp is not None else {}
    settings = body.get("default_generation_settings") if isinstance(body, dict) else None
    return _count(settings.get("n_ctx")) or None if isinstance(settings, dict) else None
