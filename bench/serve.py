"""Several clients at once against a real `parley serve`: aggregate tok/s, time to first token and gaps, memory.

Starts `parley serve` (the model flags given here) on a free 127.0.0.1 port, then for each client count and
speculation mode sends N streamed chat requests from N real HTTP clients at once ("together"), and the same kind
of requests one after another ("one by one"), in the same run, alternated for `--repeats` rounds (the figures
are the median round's): aggregate tokens per second (every reply's tokens
over the wall time from the first request to the last answer), each client's time to first token and the gap
between streamed chunks (p50 and p99 over all clients), and the server's peak RSS during the run (its window
reset before each, Linux). Each run's prompts carry their own tag in the system prompt, so no run reuses another's
cached prefix. Then a long paste beside short chats, all sent at once: each one's time to first token, beside the
paste's alone. Prints figures; asserts nothing about them.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from importlib import resources
from pathlib import Path
from typing import Any

from .harness import add_json_argument, median_run

TOPICS = ("a lighthouse keeper", "a clockmaker's apprentice", "a lost cartographer", "a beekeeper in winter",
          "a night-train conductor", "a retired astronaut", "a village baker", "a deep-sea diver", "a museum guard",
          "a glassblower", "a ferry captain", "a mountain guide", "a radio operator", "a street violinist",
          "a librarian who finds a map", "a botanist on an island")
CHATS = ("Hi! What is a good name for a grey cat?", "What is the capital of Portugal, and one fact about it?",
         "Suggest a quick vegetarian lunch.", "How do I say thank you in Japanese?")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..app import cli  # app: `parley serve`'s own model flags, passed on to it

    cli.add_model_arguments(p)
    p.add_argument("--clients", default="1,2,4,8", help="comma-separated numbers of clients at once")
    p.add_argument("--tokens", type=int, default=128, help="max_tokens of each reply")
    p.add_argument("--speculation", default="off",
                   help="comma-separated speculation modes to run each client count with (e.g. off,auto)")
    p.add_argument("--repeats", type=int, default=3,
                   help="rounds of (one by one, together) for each client count, alternated; figures are the "
                        "median round's (a shared machine moves a single round by a third)")
    p.add_argument("--paste-tokens", type=int, default=1500,
                   help="the long paste sent beside three short chats (about this many tokens); 0 to skip")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds the server may take to start (a first run quantizes), and a request to answer")
    add_json_argument(p)


def run(args: argparse.Namespace) -> int:
    counts = [int(c) for c in str(args.clients).split(",") if c.strip()]
    modes = [m.strip() for m in str(args.speculation).split(",") if m.strip()]
    if not counts or min(counts) < 1:
        raise ValueError(f"--clients {args.clients!r}: expected positive numbers, e.g. 1,2,4,8")
    with Server(args, max(max(counts), 4)) as server:
        results: dict[str, Any] = {"model": server.model, "tokens": args.tokens, "parallel": server.parallel,
                                   "load_1min": round(os.getloadavg()[0], 2), "runs": []}
        # Warm up: as many replies at once as the largest run, so every KV slot exists (a slot is made the first
        # time that many replies run together: ~0.1 s each) and the thread count has been tuned.
        at_once([lambda i=i: Client(server, f"warm-up {i}").chat(CHATS[i % len(CHATS)], 16, "off")
                 for i in range(max(counts))])
        tag = 0
        for mode in modes:
            for n in counts:
                asks = [(story(i), args.tokens, mode) for i in range(n)]
                rounds: dict[str, list[dict[str, Any]]] = {"one_by_one": [], "together": []}
                for _ in range(max(1, args.repeats)):
                    rounds["one_by_one"].append(server.measure(
                        lambda a=asks, t=tag + 1: [Client(server, f"run {t}").chat(*x) for x in a]))
                    rounds["together"].append(server.measure(lambda a=asks, t=tag + 2: at_once(
                        [lambda x=x, t=t: Client(server, f"run {t}").chat(*x) for x in a])))
                    tag += 2
                one_by_one, together = (
                    {**median_run(r, "tok_s"), "tok_s_rounds": [x["tok_s"] for x in r]}
                    for r in (rounds["one_by_one"], rounds["together"]))
                results["runs"].append({"clients": n, "speculation": mode, "one_by_one": one_by_one,
                                        "together": together,
                                        "speedup": round(together["tok_s"] / one_by_one["tok_s"], 2)
                                        if one_by_one["tok_s"] else None})
        if args.paste_tokens:
            results["paste"] = paste_beside_chats(server, args.paste_tokens, tag + 1)
        results["load_1min_after"] = round(os.getloadavg()[0], 2)
    if args.json:
        print(json.dumps(results))
    else:
        for line in lines(results):
            print(line)
    return 0


def story(i: int) -> str:
    return f"Write a long story about {TOPICS[i % len(TOPICS)]}."


def at_once(calls: list) -> list[dict[str, Any]]:
    """Run the calls in threads released together; their results in order."""
    start = threading.Barrier(len(calls))
    out: list[Any] = [None] * len(calls)

    def go(i: int) -> None:
        start.wait()
        try:
            out[i] = calls[i]()
        except BaseException as e:  # noqa: BLE001 - reported below
            out[i] = e

    threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summary(replies: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    tokens = sum(r["tokens"] for r in replies)
    gaps = [g for r in replies for g in r["gaps"]]
    ttft = [r["ttft_s"] for r in replies]
    return {"replies": len(replies), "tokens": tokens, "wall_s": round(wall, 3),
            "tok_s": round(tokens / wall, 2) if wall > 0 else 0.0,
            "ttft_p50_s": _r(percentile(ttft, 0.5)), "ttft_p99_s": _r(percentile(ttft, 0.99)),
            "gap_p50_s": _r(percentile(gaps, 0.5)), "gap_p99_s": _r(percentile(gaps, 0.99)),
            "batch_max": max((r["batch"] for r in replies), default=1)}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


class Server:
    """`parley serve` in a subprocess on 127.0.0.1 with the model flags of `args`, on a port it picks itself
    (`--port 0`: no other process can take the port between a probe and the bind); its output is kept, and shown
    when the bench fails."""

    def __init__(self, args: argparse.Namespace, parallel: int) -> None:
        self.args = args
        self.parallel = args.parallel or parallel
        self.timeout = args.timeout
        self.host = "127.0.0.1"
        self.port = 0
        self.model = ""
        self.log: deque[str] = deque(maxlen=200)

    def __enter__(self) -> Server:
        from ..app import cli  # app: the model flags given here, as `parley serve` reads them
        from ..app.server.web import flags

        model_flags = flags(self.args, cli.add_model_arguments, skip=("parallel",))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "parley.app.cli", "serve", "--host", self.host, "--port", "0",
             "--parallel", str(self.parallel), "--queue-size", str(4 * self.parallel), *model_flags],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            env={k: v for k, v in os.environ.items() if k != "PARLEY_API_KEY"})  # its own server: no key asked
        listening = threading.Event()
        url = re.compile(r" on http://127\.0\.0\.1:(\d+)/v1 ")

        def read() -> None:  # drains the server's output all along, so it never blocks on a full pipe
            for line in self.proc.stdout:
                self.log.append(line.rstrip("\n"))
                if not listening.is_set() and (m := url.search(line)):
                    self.port = int(m.group(1))
                    listening.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.timeout
        try:
            while not listening.wait(0.2):
                if self.proc.poll() is not None:
                    raise ValueError(f"parley serve exited with {self.proc.returncode}")
                if time.monotonic() > deadline:
                    raise ValueError(f"parley serve did not listen within --timeout {self.timeout:g} s")
            self.model = self.get("/v1/models")["data"][0]["id"]
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
        if exc and exc[0] is not None:  # the bench failed: what the server said
            print("parley serve's last lines:\n  " + "\n  ".join(self.log), file=sys.stderr)

    def get(self, path: str) -> dict[str, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            if resp.status != 200:
                raise ValueError(f"GET {path}: {resp.status}")
            return json.loads(resp.read())
        finally:
            conn.close()

    def _status_mb(self, field: str) -> float | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    return round(int(line.split()[1]) / 1024, 1)
        except (OSError, ValueError):
            pass
        return None

    def measure(self, work) -> dict[str, Any]:
        """Run `work` (returning the replies' figures) between a reset of the server's peak RSS and its reading."""
        with contextlib.suppress(OSError):  # Linux: start a new peak-RSS window
            Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        started = time.perf_counter()
        replies = work()
        out = summary(replies, time.perf_counter() - started)
        out["peak_rss_mb"] = self._status_mb("VmHWM")
        return out


class Client:
    """One HTTP client: a streamed chat completion, timed chunk by chunk."""

    def __init__(self, server: Server, tag: str) -> None:
        self.server, self.tag = server, tag

    def chat(self, text: str, max_tokens: int, speculation: str) -> dict[str, Any]:
        body = {"model": self.server.model, "stream": True, "stream_options": {"include_usage": True},
                "temperature": 0, "max_tokens": max_tokens, "speculation": speculation,
                "messages": [{"role": "system", "content": f"You are a helpful assistant ({self.tag})."},
                             {"role": "user", "content": text}]}
        conn = http.client.HTTPConnection(self.server.host, self.server.port, timeout=self.server.timeout)
        started = time.perf_counter()
        times: list[float] = []
        usage: dict[str, Any] = {}
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise ValueError(f"parley serve answered {resp.status}: {resp.read()[:200]!r}")
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                    times.append(time.perf_counter())
        finally:
            conn.close()
        parley = usage.get("parley") or {}
        return {"tokens": usage.get("completion_tokens", len(times)),
                "prompt_tokens": usage.get("prompt_tokens", 0),
                "ttft_s": (times[0] - started) if times else time.perf_counter() - started,
                "gaps": [b - a for a, b in zip(times, times[1:], strict=False)],
                "batch": parley.get("batch", 1)}


def paste_beside_chats(server: Server, tokens: int, tag: int) -> dict[str, Any]:
    """A paste of about `tokens` tokens and three short chats sent at once; then the paste alone (fresh tag)."""
    text = resources.files("parley").joinpath("assets/heldout/python_reference.txt").read_text()
    text = text[: int(4.3 * tokens)].rsplit(" ", 1)[0]  # ~4.3 characters a token
    paste = "Summarise this document in three sentences.\n\n" + text

    def ask(message: str, t: str, n: int) -> dict[str, Any]:
        return Client(server, t).chat(message, n, "off")

    calls = [lambda: ask(paste, f"paste {tag}", 32)] + [lambda c=c: ask(c, f"chat {tag}", 32) for c in CHATS[1:]]
    started = time.perf_counter()
    replies = at_once(calls)
    wall = time.perf_counter() - started
    alone = ask(paste, f"paste alone {tag}", 32)
    chats = [r["ttft_s"] for r in replies[1:]]
    return {"paste_prompt_tokens": replies[0]["prompt_tokens"], "paste_ttft_s": _r(replies[0]["ttft_s"]),
            "paste_alone_ttft_s": _r(alone["ttft_s"]), "chat_ttft_s": [_r(t) for t in chats],
            "chat_ttft_max_over_paste": round(max(chats) / replies[0]["ttft_s"], 3), "wall_s": round(wall, 3)}


def lines(r: dict[str, Any]) -> list[str]:
    from .harness import table

    out = [f"parley bench serve: {r['model']}, {r['tokens']} tokens a reply, --parallel {r['parallel']}; load "
           f"{r['load_1min']} before, {r['load_1min_after']} after (1-min average)"]
    rows = []
    for run in r["runs"]:
        for how in ("one_by_one", "together"):
            f = run[how]
            rows.append([f"{run['clients']} x {run['speculation']}", how.replace("_", " "), f["tokens"],
                         f["tok_s"], f"{run['speedup']}x" if how == "together" else "", f["ttft_p50_s"],
                         f["ttft_p99_s"], f["gap_p50_s"], f["gap_p99_s"], f["batch_max"], f["peak_rss_mb"]])
    out += table(["clients", "sent", "tokens", "tok/s", "speedup", "ttft p50 s", "ttft p99 s", "gap p50 s",
                  "gap p99 s", "batch", "peak RSS MB"], rows)
    if "paste" in r:
        p = r["paste"]
        out.append(f"paste of {p['paste_prompt_tokens']} prompt tokens beside 3 short chats: chats' first tokens "
                   f"after {', '.join(f'{t:.2f}' for t in p['chat_ttft_s'])} s, the paste's after "
                   f"{p['paste_ttft_s']:.2f} s (alone {p['paste_alone_ttft_s']:.2f} s): the slowest chat waited "
                   f"{p['chat_ttft_max_over_paste']:.2f}x the paste's time")
    return out
