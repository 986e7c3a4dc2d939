"""The KV cache type the user asks for is the one a reply runs on, end to end on the real model: `--kv-cache`
and PARLEY_KV_CACHE for `parley generate`, `parley serve` and the chat app (whose panel sets it too).

With an fp cache the native fp32 step's greedy reply equals transformers' on the same GGUF; the default
int8 cache's reply to this question leaves transformers' within a few words, so a flag that is dropped on
the way to the reply (as it once was: every reply ran on int8) fails the text check, not only the figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
import torch
from app_support import wait_until

from parley.app import cli, tui
from parley.app.engine_from_args import engine_from_args

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers needs it to load a GGUF
pytestmark = [pytest.mark.slow, pytest.mark.anyio]

QUESTION = "Why is the sky blue?"
NEW_TOKENS = 32
GREEDY = ["--quant", "none", "--temperature", "0", "--max-new-tokens", str(NEW_TOKENS)]


@pytest.fixture(scope="module")
def reference() -> str:
    """transformers' greedy reply to QUESTION on the embedded GGUF, as `parley generate` prints it."""
    from parley.models.resolve import embedded_model_path, resolve
    from parley.models.tokenizer import load_tokenizer

    path = embedded_model_path()
    tok = load_tokenizer(resolve(str(path)))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                            dtype=torch.float32).eval()
    ids = tok.encode_chat([{"role": "user", "content": QUESTION}])
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(ids):].tolist()
    stop = next((i for i, t in enumerate(out) if t in tok.stop_ids), len(out))
    return tok.decode(out[:stop])


def generate(*flags: str, env: dict[str, str] | None = None) -> tuple[str, dict]:
    run_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    run_env.pop("PARLEY_KV_CACHE", None) if "PARLEY_KV_CACHE" not in (env or {}) else None
    out = subprocess.run([sys.executable, "-m", "parley.app.cli", "generate", *GREEDY, "--stats", *flags, QUESTION],
                         capture_output=True, text=True, env=run_env, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.removesuffix("\n"), json.loads(out.stderr.strip().splitlines()[-1])


def test_generate_kv_cache_fp_is_transformers_greedy_reply(reference):
    text, stats = generate("--kv-cache", "fp")
    assert (stats["kv_cache"], stats["step"]) == ("fp", "native")
    assert text == reference


def test_generate_reads_PARLEY_KV_CACHE_and_the_flag_wins(reference):
    text, stats = generate(env={"PARLEY_KV_CACHE": "fp"})
    assert stats["kv_cache"] == "fp" and text == reference
    _, stats = generate("--kv-cache", "k8v4", env={"PARLEY_KV_CACHE": "fp"})
    assert stats["kv_cache"] == "k8v4"
    text, stats = generate()  # the CPU default, for contrast: the reply the dropped flag used to give
    assert stats["kv_cache"] == "int8" and text != reference


def test_serve_kv_cache_fp_is_transformers_greedy_reply(reference, monkeypatch):
    from serve_support import running_server

    monkeypatch.delenv("PARLEY_KV_CACHE", raising=False)
    args = cli.build_parser(["serve"]).parse_args(["serve", *GREEDY[:2], "--kv-cache", "fp"])
    engine = engine_from_args(args)
    with running_server(engine) as (_, url):
        body = {"model": engine.model_name, "messages": [{"role": "user", "content": QUESTION}], "temperature": 0,
                "max_tokens": NEW_TOKENS}
        answer = httpx.post(f"{url}/chat/completions", json=body, timeout=600).json()
    assert "usage" in answer, answer
    assert answer["usage"]["parley"]["kv_cache"] == "fp" and answer["usage"]["parley"]["step"] == "native"
    assert answer["choices"][0]["message"]["content"] == reference


async def test_app_kv_cache_flag_then_the_panel(reference, monkeypatch):
    from textual.widgets import Select

    monkeypatch.delenv("PARLEY_KV_CACHE", raising=False)
    args = cli.build_parser(["chat"]).parse_args(["chat", *GREEDY, "--kv-cache", "fp"])
    app = tui.build_app(args)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(lambda: app.engine is not None and app.engines.loading is None, timeout=300)
        await pilot.pause()

        async def ask() -> str:
            before = len(app.chat.messages)
            app.prompt.focus()
            app.prompt.load_text(QUESTION)
            await pilot.press("enter")
            await wait_until(lambda: len(app.chat.messages) >= before + 2 and not app.generating, timeout=300)
            return app.chat.messages[-1].content

        assert await ask() == reference
        assert app.status.stats.kv_cache == "fp" and app.status.stats.step == "native"
        app.query_one("#kv-cache", Select).value = "bf16"  # the panel: from the next reply on
        await wait_until(lambda: app.engine.kv_cache == "bf16")
        await ask()
        assert app.status.stats.kv_cache == "bf16"
