"""`parley serve` over the real model, driven by the official `openai` client: what it answers is what the
engine makes, streamed or whole, with usage, the reused prefix, stop strings and the sampling fields honoured."""

from __future__ import annotations

import pytest
from serve_support import real_engine, running_server

from parley.engine.events import TextDelta
from parley.engine.params import GenerationParams

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
POEM = [{"role": "user", "content": "Write a poem about the sea."}]  # open-ended: sampling wanders off greedy


@pytest.fixture(scope="module")
def served():
    with running_server() as (server, url):
        yield server, openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)


def engine_text(messages, max_new_tokens: int) -> str:
    """The engine's own greedy reply, without HTTP in between."""
    params = GenerationParams(temperature=0.0, max_new_tokens=max_new_tokens)
    return "".join(e.text for e in real_engine().session().reply(messages, params) if isinstance(e, TextDelta))


def test_models_lists_the_engine(served):
    server, client = served
    (model,) = client.models.list().data
    assert model.id == real_engine().model_name and model.owned_by == "parley"
    assert model.model_extra["max_model_len"] == real_engine().context_window


def test_whole_and_streamed_replies_equal_the_engine(served):
    server, client = served
    model = real_engine().model_name
    expected = engine_text(QUESTION, 12)
    whole = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=12)
    assert whole.choices[0].message.content == expected
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens >= 1 and whole.usage.prompt_tokens > 0

    stream = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # The same prompt again: the engine kept its KV, so all but the last prompt token was reused.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1
    assert "acceptance_rate" in chunks[-1].usage.model_extra["parley"]


def test_next_turn_reuses_the_conversation_prefix(served):
    server, client = served
    model = real_engine().model_name
    first = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=10)
    turn = [*QUESTION, {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And of Italy?"}]
    second = client.chat.completions.create(model=model, messages=turn, temperature=0, max_tokens=10)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_max_tokens_and_stop_strings(served):
    server, client = served
    model = real_engine().model_name
    prompt = "The capital of France is Paris. The capital of Germany is"
    free = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=8)
    assert free.choices[0].finish_reason == "length" and free.usage.completion_tokens == 8
    text = free.choices[0].text
    words = text.split()
    assert len(words) >= 2, text
    stop = " " + words[1]  # a stop string in the middle of what greedy decoding writes
    cut = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=8, stop=[stop],
                                    stream=True)
    pieces = list(cut)
    assert "".join(p.choices[0].text for p in pieces) == text[: text.index(stop)]
    assert pieces[-1].choices[0].finish_reason == "stop"


def test_sampling_fields_reach_the_engine(served):
    server, client = served
    model = real_engine().model_name
    greedy = client.chat.completions.create(model=model, messages=POEM, temperature=0, max_tokens=16)
    # top_k=1 leaves only the argmax, whatever the temperature; so does min_p close to 1.
    top_k = client.chat.completions.create(model=model, messages=POEM, temperature=1.5, max_tokens=16, seed=1,
                                           extra_body={"top_k": 1})
    min_p = client.chat.completions.create(model=model, messages=POEM, temperature=1.5, max_tokens=16, seed=2,
                                           extra_body={"min_p": 0.999})
    assert top_k.choices[0].message.content == greedy.choices[0].message.content
    assert min_p.choices[0].message.content == greedy.choices[0].message.content
    # The same seed, the same sampled reply.
    a, b = (client.chat.completions.create(model=model, messages=POEM, temperature=1.5, max_tokens=16, seed=11)
            for _ in range(2))
    assert a.choices[0].message.content == b.choices[0].message.content
