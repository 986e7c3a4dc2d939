"""The remote backend reads each server's documented stream format, finish reasons, usage and self-description.

One test per server we cannot run here: a fake server replays that server's `GET /v1/models` answer and SSE
chunks, and we check what the client decided (which fields it sends, what it greys out, how it continues a
reply after a live change) and what it yields.
"""

from __future__ import annotations

import json
from functools import cache

from fake_openai_server import fake_server

from parley.engine.events import Done, Notice, Stats, TextDelta
from parley.engine.params import GenerationParams
from parley.engine.remote import RemoteEngine

MESSAGES = [{"role": "user", "content": "Say hello."}]


def chunks(model: str, pieces: list[str], finish: str, *, role_first: bool = True, **last: object) -> list[str]:
    """An OpenAI chat stream: an optional role chunk, one chunk per piece, the finish chunk (+ `last` fields)."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1733000000, "model": model}
    out = []
    if role_first:
        out.append({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]})
    out += [{**base, "choices": [{"index": 0, "delta": {"content": p}, "logprobs": None, "finish_reason": None}]}
            for p in pieces]
    out.append({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}], **last})
    return [json.dumps(c) for c in out]


def usage_chunk(model: str, **usage: object) -> str:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1733000000, "model": model,
                       "choices": [], "usage": usage})


def run(engine: RemoteEngine, params: GenerationParams, change=None) -> list:
    """All events of one reply; `change(params)` is applied when the first text arrives (a slider moved)."""
    events = []
    for ev in engine.session().reply(MESSAGES, params):
        events.append(ev)
        if change and isinstance(ev, TextDelta) and sum(isinstance(e, TextDelta) for e in events) == 1:
            change(params)
    return events


def text(events: list) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def final_stats(events: list) -> Stats:
    return [e for e in events if isinstance(e, Stats)][-1]


@cache
def smollm_tokenizer():
    from parley.models.resolve import resolve
    from parley.models.tokenizer import load_tokenizer

    return load_tokenizer(resolve(None))


def test_vllm():
    model = "meta-llama/Llama-3.1-70B-Instruct"
    models = {"object": "list", "data": [{"id": model, "object": "model", "created": 1733000000, "owned_by": "vllm",
                                          "root": model, "parent": None, "max_model_len": 32768}]}
    first = chunks(model, ["Hel", "lo"], "length")  # the client leaves after "Hel": the rest is never read
    second = chunks(model, [" there", "!"], "length") + [usage_chunk(model, prompt_tokens=14, completion_tokens=2,
                                                                     total_tokens=16)]
    with fake_server({"/v1/models": models}, [first, second], {"server": "uvicorn"}) as (server, url):
        engine = RemoteEngine.connect(url, api_key="k")
        assert (engine.kind, engine.model_name, engine.context_window) == ("vllm", model, 32768)
        caps = engine.capabilities
        assert caps.live_params and set(caps.unsupported) == {"speculation", "draft_tokens", "kv_cache"}
        params = GenerationParams(temperature=0.3, top_k=20, min_p=0.05, seed=7, max_new_tokens=6)
        events = run(engine, params, change=lambda p: setattr(p, "temperature", 0.9))
        assert text(events) == "Hel there!"
        assert events[-1] == Done("length", "max_new_tokens=6 reached")
        (path1, body1, headers1), (path2, body2, _) = server.posts
        assert path1 == path2 == "/v1/chat/completions"
        assert headers1["authorization"] == "Bearer k"
        assert (body1["top_k"], body1["min_p"], body1["seed"], body1["temperature"]) == (20, 0.05, 7, 0.3)
        assert body1["messages"] == MESSAGES and body1["stream_options"] == {"include_usage": True}
        # The change restarts the reply as a continuation of the assistant message, under the new temperature.
        assert body2["continue_final_message"] is True and body2["add_generation_prompt"] is False
        assert body2["messages"] == [*MESSAGES, {"role": "assistant", "content": "Hel"}]
        assert body2["temperature"] == 0.9 and body2["max_tokens"] == 6 - 1
        # The continuation's prompt already holds "Hel": the context is that prompt plus what followed.
        stats = final_stats(events)
        assert (stats.new_tokens, stats.context_tokens, stats.context_window) == (1 + 2, 14 + 2, 32768)


def test_sglang():
    model = "Qwen/Qwen2.5-7B-Instruct"
    models = {"object": "list", "data": [{"id": model, "object": "model", "created": 1733000000,
                                          "owned_by": "sglang", "root": model, "max_model_len": 131072}]}
    stream = chunks(model, ["Hi", ",", " you"], "stop", matched_stop=151645, usage=None)
    stream.append(usage_chunk(model, prompt_tokens=20, completion_tokens=3, total_tokens=23,
                              prompt_tokens_details={"cached_tokens": 16}))
    with fake_server({"/v1/models": models}, [stream]) as (server, url):
        engine = RemoteEngine.connect(url)
        assert (engine.kind, engine.context_window) == ("sglang", 131072)
        assert "top_k" not in engine.capabilities.unsupported and engine.capabilities.live_params
        events = run(engine, GenerationParams(top_k=5))
        assert text(events) == "Hi, you" and events[-1] == Done("eos")
        stats = final_stats(events)
        assert (stats.new_tokens, stats.prompt_tokens, stats.reused_tokens, stats.context_tokens) == (3, 4, 16, 23)
        assert server.posts[0][1]["top_k"] == 5 and "authorization" not in server.posts[0][2]


def test_llama_server():
    model = "SmolLM2-135M-Instruct-Q8_0.gguf"
    models = {"object": "list", "data": [{"id": model, "object": "model", "created": 1733000000,
                                          "owned_by": "llamacpp", "meta": {"n_ctx_train": 8192, "n_vocab": 49152}}]}
    props = {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1}
    timings = {"prompt_n": 9, "cache_n": 0, "prompt_ms": 10.0, "predicted_n": 4, "predicted_ms": 40.0,
               "predicted_per_second": 100.0, "draft_n": 6, "draft_n_accepted": 3}
    first = chunks(model, ["Sure", "."], "stop", role_first=False)[:1]  # cut short by the client
    completion = [json.dumps({"choices": [{"text": t, "index": 0, "logprobs": None, "finish_reason": f}],
                              "object": "text_completion", "model": model, **extra})
                  for t, f, extra in [(" Here", None, {}), (" it is", None, {}),
                                      ("", "stop", {"timings": timings,
                                                    "usage": {"prompt_tokens": 9, "completion_tokens": 4}})]]
    gets = {"/v1/models": models, "/props": props}
    with fake_server(gets, [first, completion], {"Server": "llama.cpp"}) as (server, url):
        tokenizer = smollm_tokenizer()
        without = RemoteEngine.connect(url)
        assert not without.capabilities.live_params and "--tokenizer" in without.capabilities.live_params_note
        engine = RemoteEngine.connect(url, tokenizer=tokenizer)
        # /props gives the running context; the trained length in /v1/models is only the fallback.
        assert (engine.kind, engine.context_window) == ("llamacpp", 2048)
        assert engine.capabilities.live_params and engine.capabilities.speculation
        params = GenerationParams(min_p=0.1)
        events = run(engine, params, change=lambda p: setattr(p, "top_p", 0.5))
        assert text(events) == "Sure Here it is" and events[-1] == Done("eos")
        # No continue_final_message on llama-server: the chat template is rendered here and continued raw.
        path, body, _ = server.posts[-1]
        assert path == "/v1/completions"
        assert body["prompt"] == tokenizer.render_chat(MESSAGES) + "Sure"
        assert body["top_p"] == 0.5 and body["min_p"] == 0.1
        stats = final_stats(events)
        assert (stats.accepted, stats.proposed) == (3, 6)  # speculative acceptance from llama-server's timings
        assert stats.new_tokens == 1 + 4


def test_ollama():
    model = "llama3.2:latest"
    models = {"object": "list", "data": [{"id": model, "object": "model", "created": 1733000000,
                                          "owned_by": "library"}]}
    base = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1733000000, "model": "llama3.2",
            "system_fingerprint": "fp_ollama"}
    stream = [json.dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": c},
                                               "finish_reason": f}]})
              for c, f in [("Bon", None), ("jour", None), ("", "stop")]]
    stream.append(json.dumps({**base, "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 2,
                                                               "total_tokens": 13}}))
    gets = {"/v1/models": models, "/api/version": {"version": "0.6.2"}}
    with fake_server(gets, [stream]) as (server, url):
        engine = RemoteEngine.connect(url, context_window=4096)
        assert (engine.kind, engine.context_window) == ("ollama", 4096)
        caps = engine.capabilities
        assert "Ollama" in caps.unsupported["top_k"] and "Ollama" in caps.unsupported["min_p"]
        assert "seed" not in caps.unsupported
        assert not caps.live_params and "next reply" in caps.live_params_note
        params = GenerationParams(top_k=40, min_p=0.2, seed=3)
        events = run(engine, params, change=lambda p: setattr(p, "temperature", 1.5))
        assert text(events) == "Bonjour" and events[-1] == Done("eos")
        # The change cannot apply to this reply: said once, and no second request.
        assert [e.text for e in events if isinstance(e, Notice)] == [caps.live_params_note]
        (_, body, _), = server.posts
        assert "top_k" not in body and "min_p" not in body and body["seed"] == 3
        assert final_stats(events).new_tokens == 2


def test_any_other_openai_compatible_server():
    model = "gpt-4o-mini"
    models = {"object": "list", "data": [{"id": model, "object": "model", "created": 1733000000,
                                          "owned_by": "system"}]}
    with fake_server({"/v1/models": models}, [chunks(model, ["Ok"], "stop")]) as (server, url):
        engine = RemoteEngine.connect(url)
        assert (engine.kind, engine.context_window) == ("openai", 4096)  # nothing said: the default
        caps = engine.capabilities
        assert set(caps.unsupported) == {"top_k", "min_p", "speculation", "draft_tokens", "kv_cache"}
        assert not caps.live_params
        events = run(engine, GenerationParams(top_k=5, min_p=0.1, seed=1))
        assert text(events) == "Ok" and events[-1] == Done("eos")
        (_, body, _), = server.posts
        assert "top_k" not in body and "min_p" not in body and body["seed"] == 1  # OpenAI rejects unknown fields
