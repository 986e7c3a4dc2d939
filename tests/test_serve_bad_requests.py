"""Bad requests get 400 with a message naming the field (never a traceback, never a dead server); a wrong or
missing API key gets 401 and the key is never logged."""

from __future__ import annotations

import httpx
import pytest
from serve_support import real_engine, running_server

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

OK = [{"role": "user", "content": "Hi"}]
KEY = "sk-test-7f3a9c"


@pytest.fixture(scope="module")
def served():
    with running_server(api_key=KEY) as (server, url):
        yield server, url, openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=300)


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"model": "gpt-4"}, "model", "not served"),
    ({"temperature": 3.5}, "temperature", "out of range"),
    ({"top_p": 0}, "top_p", "out of range"),
    ({"top_k": -4}, "top_k", "top_k=-4"),
    ({"min_p": 1.5}, "min_p", "out of range"),
    ({"max_tokens": 0}, "max_tokens", "positive integer"),
    ({"seed": "abc"}, "seed", "integer"),
    ({"stop": [""]}, "stop", "non-empty"),
    ({"n": 3}, "n", "n=1"),
    ({"messages": []}, "messages", "non-empty list"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "system, user or assistant"),
    ({"messages": [{"role": "user", "content": "word " * 9000}]}, "messages", "context window"),
])
def test_bad_field_is_named(served, fields, param, words):
    server, url, _ = served
    body = {"model": real_engine().model_name, "messages": OK, "max_tokens": 2, **fields}
    resp = httpx.post(f"{url}/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and param.split("[")[0] in error["message"] and words in error["message"]
    assert "Traceback" not in resp.text


def test_invalid_json_and_unknown_routes(served):
    server, url, client = served
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    resp = httpx.post(f"{url}/chat/completions", content=b"{not json", headers=auth)
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"]
    resp = httpx.post(f"{url}/completions", json={"prompt": 7}, headers=auth)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"
    assert httpx.get(f"{url}/engines", headers=auth).status_code == 404
    # The server is alive and well after all of them.
    reply = client.chat.completions.create(model=real_engine().model_name, messages=OK, max_tokens=2)
    assert reply.usage.completion_tokens >= 1


def test_api_key_required_and_never_logged(served):
    server, url, _ = served
    assert httpx.get(f"{url}/models").status_code == 401  # no key at all
    client = openai.OpenAI(base_url=url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        client.models.list()
    assert e.value.status_code == 401 and "API key" in e.value.message
    # A refused request's body is never read: the connection closes, and the next request on a fresh one works.
    body = {"model": real_engine().model_name, "messages": OK, "max_tokens": 1}
    with httpx.Client(timeout=300) as keep_alive:
        assert keep_alive.post(f"{url}/chat/completions", json=body, headers={"Authorization": "Bearer no"}
                               ).status_code == 401
        assert keep_alive.post(f"{url}/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
                               ).status_code == 200
    assert server.logged and not any(KEY in line for line in server.logged)
