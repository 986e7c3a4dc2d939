"""A seeded fuzzer for the inputs Parley takes from outside: model configs, GGUF headers, chat templates and
HTTP requests to `parley serve`. `parley bench faults --fuzz N` runs N cases of each kind; the test suite a few.

Each case is made from its own seed (`seed * 1_000_003 + i`) by mutating a valid input with a `random.Random`,
so a failure names the one seed that rebuilds it (`case(kind, seed)`). What each kind must do:
- config: `ModelConfig.from_hf` returns a config or raises a one-line `ModelLoadError`, nothing else;
- gguf: `open_gguf` (and `ModelConfig.from_gguf` of what it read) returns or raises a one-line `ModelLoadError`,
  within the memory the file could justify;
- template: `render` returns text or raises a one-line ValueError, within its limits;
- http: every answer of `parley serve` is a well-formed status line that is not 500, the log holds no raw
  control character and the server still answers a valid request afterwards.
Mutation, not a grammar: the valid input carries the structure, so most cases get past the first check and
reach the deeper ones.
"""

from __future__ import annotations

import json
import random
import resource
import struct
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

KINDS = ("config", "gguf", "template", "http")
MAX_GROWTH_MB = 512  # peak memory a case may add; a size check skipped shows as gigabytes


def case_seed(seed: int, i: int) -> int:
    return seed * 1_000_003 + i


# -- values ------------------------------------------------------------------------------------------


def hostile_value(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value of any type, often an edge: 0, negatives, 2^40, NaN-like text, deep nesting, huge strings."""
    pick = rng.randrange(14)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, -1, 1, 2, 7, 2**31, 2**40, 2**63, -(2**63), 10**30])
    if pick == 3:
        return rng.choice([0.0, -0.5, 1e-30, 1e30, 0.5, 3.0, 1e308])
    if pick == 4:
        return rng.choice(["", "llama", "gemma3_text", "x" * 10_000, "\x1b[2J", "6", "llama3", "full_attention"])
    if pick == 5:
        return [hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))] if depth < 3 else []
    if pick == 6:
        return {rng.choice(["a", "rope_type", "factor", "type", "0"]): hostile_value(rng, depth + 1)
                for _ in range(rng.randrange(3))} if depth < 3 else {}
    if pick == 7:  # deep nesting
        nested: list[Any] = []
        for _ in range(rng.choice([10, 1000, 50_000])):
            nested = [nested]
        return nested
    if pick == 8:
        return {"rope_type": rng.choice(["llama3", "linear", "yarn", "default"]),
                "factor": hostile_value(rng, depth + 1)} | ({"low_freq_factor": hostile_value(rng, depth + 1)}
                                                           if rng.random() < 0.5 else {})
    if pick == 9:
        return [rng.choice(["full_attention", "sliding_attention", 1, None]) for _ in range(rng.randrange(40))]
    return rng.choice([1, 2, 4, 8, 16, 32, 64, 128, 256])  # often valid: the next field gets checked


# -- config ------------------------------------------------------------------------------------------

BASE_CONFIG = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
CONFIG_FIELDS = [*BASE_CONFIG, "head_dim", "rope_scaling", "rope_parameters", "layer_types", "sliding_window",
                 "sliding_window_pattern", "_sliding_window_pattern", "quantization_config", "text_config",
                 "query_pre_attn_scalar", "rope_local_base_freq", "tie_word_embeddings", "attention_bias"]


def config_case(rng: random.Random) -> Callable[[], Any]:
    from ..models.config import ModelConfig

    cfg: Any = dict(BASE_CONFIG)
    if rng.random() < 0.4:
        cfg["model_type"] = rng.choice(["gemma3_text", "gemma3", "qwen2", "qwen3", "mistral"])
    for _ in range(rng.randrange(1, 4)):
        cfg[rng.choice(CONFIG_FIELDS)] = hostile_value(rng)
    if rng.random() < 0.05:
        cfg = hostile_value(rng)
    return lambda: ModelConfig.from_hf(cfg, source="fuzz/config.json")


# -- gguf --------------------------------------------------------------------------------------------

_GGUF_HEAD: bytes | None = None


GGUF_HEAD_BYTES = 5 << 19  # the embedded model's metadata (tokens, merges) and tensor list fit in 2.5 MB


def gguf_head() -> bytes:
    """The start of the embedded model's GGUF: every header byte, few of the weights (the fuzzer mutates the
    header; a tensor running past the end is one more error to report cleanly)."""
    global _GGUF_HEAD
    if _GGUF_HEAD is None:
        from ..models.resolve import embedded_model_path

        with open(embedded_model_path(), "rb") as f:
            _GGUF_HEAD = f.read(GGUF_HEAD_BYTES)
    return _GGUF_HEAD


def gguf_case(rng: random.Random, folder: Path) -> Callable[[], Any]:
    from ..models.config import ModelConfig
    from ..models.gguf_weights import open_gguf

    data = bytearray(gguf_head())
    header_end = len(data)
    for _ in range(rng.randrange(1, 6)):
        at = rng.choice([8, 16, rng.randrange(24, 4096), rng.randrange(24, header_end - 8)])
        how = rng.randrange(4)
        if how == 0:  # a count or length: huge, zero or one off
            struct.pack_into("<Q", data, at, rng.choice([0, 1, 2**32, 2**40, 2**63, 2**64 - 1]))
        elif how == 1:  # a type tag
            struct.pack_into("<I", data, at, rng.choice([0, 8, 9, 12, 13, 255, 2**31]))
        elif how == 2:
            data[at] ^= 1 << rng.randrange(8)
        else:
            del data[at: at + rng.randrange(1, 64)]
    if rng.random() < 0.2:
        data = data[: rng.randrange(len(data))]
    path = folder / "fuzz.gguf"
    path.write_bytes(bytes(data))

    def run() -> Any:
        file = open_gguf(path)
        return ModelConfig.from_gguf(file)
    return run


# -- template ----------------------------------------------------------------------------------------

TEMPLATE_PARTS = [
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
    "{% set ns = namespace(s='ab', l=[1]) %}", "{% for i in range(N) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{% for i in range(N) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}", "{{ ns.l }}", "{{ ns.s|length }}",
    "{{ ns.l|tojson }}", "{{ 'x' * N }}", "{{ '%*d' % (N, 1) }}", "{{ '%Nd' % 1 }}", "{{ 'a'.zfill(N) }}",
    "{{ 'a'|center(N) }}", "{{ '{:>N}'.format('a') }}", "{{ messages|tojson }}", "{{ ns.s ~ ns.s }}",
    "{{ range(N)|list|length }}", "{{ raise_exception('no') }}", "{{ ''.__class__ }}", "{{ lipsum(n=N) }}",
    "{% for i in range(N) %}{% for j in range(N) %}{% endfor %}{% endfor %}", "{{ N ** N }}",
    "{% if add_generation_prompt %}<|assistant|>{% endif %}", "{{ messages[0]['content'] * N }}",
    "{{ (messages|string) * N }}", "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", "{{ x.y.z }}",
]


def template_case(rng: random.Random) -> Callable[[], Any]:
    from ..models import chat_template

    parts = [rng.choice(TEMPLATE_PARTS) for _ in range(rng.randrange(1, 5))]
    source = "".join(p.replace("N", str(rng.choice([1, 3, 40, 1000, 10**6, 10**9, 10**12]))) for p in parts)
    if rng.random() < 0.2:  # a cut or doubled piece: syntax errors
        cut = rng.randrange(len(source))
        source = source[:cut] + rng.choice(["", "{%", "}}", "{{", source[cut:]])
    messages = [{"role": "user", "content": rng.choice(["hi", "x" * 1000, "\x00"])}]
    return lambda: chat_template.render(source, messages, time_limit_s=2.0, origin="fuzz template")


# -- http --------------------------------------------------------------------------------------------

BODY = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).encode()


def http_request(rng: random.Random) -> bytes:
    """A valid request to `parley serve`, mutated: headers duplicated, dropped or changed, bytes of the request
    line or the body flipped, control characters, framing that disagrees with the body."""
    headers = [("Host", "127.0.0.1"), ("Content-Type", "application/json"), ("Content-Length", str(len(BODY)))]
    method, path, version, body = "POST", "/v1/chat/completions", "HTTP/1.1", BODY
    for _ in range(rng.randrange(1, 4)):
        how = rng.randrange(9)
        if how == 0:
            headers.append(rng.choice(headers))
        elif how == 1 and headers:
            headers.pop(rng.randrange(len(headers)))
        elif how == 2:
            headers.append(rng.choice([("Transfer-Encoding", "chunked"), ("Content-Length", "5"),
                                       ("Content-Length", "+9"), ("Host", "attacker.example"),
                                       ("Origin", "https://attacker.example"), ("Content-Type", "text/plain"),
                                       ("Expect", "100-continue"), ("Connection", "keep-alive"),
                                       ("X-\x1b[2J", "\x07"), ("Authorization", "Bearer x")]))
        elif how == 3:
            method = rng.choice(["GET", "PUT", "OPTIONS", "DELETE", "P\x1bST", "", "POST POST"])
        elif how == 4:
            path = rng.choice(["/v1/models", "/health", "/\x1b]0;x\x07", "/" + "a" * 70_000, "*", "/v1/completions"])
        elif how == 5:
            version = rng.choice(["HTTP/1.0", "HTTP/2.0", "HTTP/1.1\x00", "", "HTTP/9"])
        elif how == 6 and body:
            b = bytearray(body)
            b[rng.randrange(len(b))] = rng.randrange(256)
            body = bytes(b)
        elif how == 7:
            body = body + b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        else:
            body = body[: rng.randrange(len(body) + 1)]
    head = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "Connection: close\r\n"
    return head.encode("utf-8", "replace") + b"\r\n" + body


def http_cases(n: int, seed: int, on_case: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    import re
    import threading

    from ..app.server.api import make_server  # app: the HTTP server is what these cases fuzz
    from .faults_network import exchange

    engine = _serve_engine()
    logged: list[str] = []
    server = make_server(engine, "127.0.0.1", 0, log=logged.append, timeout=0.5)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = server.server_address[:2]
    failures = []
    try:
        for i in range(n):
            s = case_seed(seed, i)
            request = http_request(random.Random(s))
            mark = len(logged)
            try:
                answer = exchange(address, request, timeout=30)
            except (TimeoutError, OSError) as e:
                answer = f"(no answer: {type(e).__name__})".encode()
            statuses = re.findall(rb"HTTP/1\.[01] (\d{3}) ", answer)
            why = None
            if answer and not answer.startswith((b"HTTP/1.", b"(no answer")) and b"\r\n" in answer:
                why = f"not an HTTP answer: {answer[:80]!r}"
            elif b"500" in statuses:
                why = "a 500"
            elif any(re.search(r"[\x00-\x08\x0b-\x1f\x7f]", line) for line in logged[mark:]):
                why = "a raw control character in the log"
            elif any("Traceback" in line for line in logged[mark:]):
                why = "a traceback in the log"
            if why is None and i % 16 == 15:  # still serving?
                ok = exchange(address, ("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                        f"application/json\r\nContent-Length: {len(BODY)}\r\nConnection: close"
                                        "\r\n\r\n").encode() + BODY, timeout=60)
                if not ok.startswith(b"HTTP/1.1 200"):
                    why = f"a valid request after it got {ok[:60]!r}"
            if why:
                failures.append({"kind": "http", "seed": s, "why": why, "input": repr(request[:200])})
            if on_case:
                on_case(i)
    finally:
        server.shutdown()
        server.server_close()
    return failures


def _serve_engine() -> Any:
    """A scripted engine for the HTTP cases: the request layer is what is fuzzed, not the model."""
    from ..engine.events import Done, TextDelta

    class Tokenizer:
        def encode(self, text: str) -> list[int]:
            return list(text.encode("utf-8"))

        def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                        cancel: Any = None) -> str:
            return "".join(m["content"] for m in messages)

        def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                        cancel: Any = None) -> list[int]:
            return self.encode(self.render_chat(messages))

    class Session:
        def reply(self, messages: Any, params: Any, cancel: Any) -> Any:
            yield TextDelta("ok")
            yield Done("length")

    class Engine:
        model_name, context_window, tokenizer = "fuzz", 4096, Tokenizer()

        def session(self, system_prompt: str | None = None) -> Session:
            return Session()

    return Engine()


# -- running -----------------------------------------------------------------------------------------


def _judge(kind: str, s: int, run: Callable[[], Any]) -> dict[str, Any] | None:
    from ..models.errors import ModelLoadError

    allowed: tuple[type[BaseException], ...] = (ModelLoadError,) if kind in ("config", "gguf") else (ValueError,)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    why = None
    try:
        run()
    except allowed as e:
        text = str(e)
        if "\n" in text or len(text) > 2000:
            why = f"an error of {text.count(chr(10)) + 1} lines / {len(text)} characters"
    except Exception as e:  # noqa: BLE001 (what the fuzzer looks for)
        why = f"{type(e).__name__}: {str(e)[:200]} at {traceback.extract_tb(e.__traceback__)[-1].filename}:" \
              f"{traceback.extract_tb(e.__traceback__)[-1].lineno}"
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    if why is None and grown > MAX_GROWTH_MB:
        why = f"peak memory grew by {grown:.0f} MB"
    return None if why is None else {"kind": kind, "seed": s, "why": why}


def case(kind: str, s: int, folder: Path) -> Callable[[], Any]:
    """The case of `kind` built from seed `s` (what a failure report names), as a function to run."""
    rng = random.Random(s)
    if kind == "config":
        return config_case(rng)
    if kind == "gguf":
        return gguf_case(rng, folder)
    if kind == "template":
        return template_case(rng)
    raise ValueError(f"no such fuzz kind {kind!r}")


def fuzz(n: int, seed: int, kinds: tuple[str, ...] = KINDS, say: Callable[[str], None] | None = None
         ) -> dict[str, Any]:
    """`n` cases of each kind: {kind: {"cases", "failures"}}, each failure with the seed that rebuilds it."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="parley-fuzz-") as tmp:
        for kind in kinds:
            if kind == "http":
                failures = http_cases(n, seed)
            else:
                failures = []
                for i in range(n):
                    s = case_seed(seed, i)
                    bad = _judge(kind, s, case(kind, s, Path(tmp)))
                    if bad:
                        failures.append(bad)
            out[kind] = {"cases": n, "failures": failures}
            if say:
                say(f"fuzz: {kind}: {n - len(failures)}/{n} handled cleanly"
                    + "".join(f"\n  FAIL fuzz {f['kind']} seed {f['seed']}: {f['why']}" for f in failures[:10]))
    return out

