"""`PARLEY_NATIVE=0 PARLEY_SHARED_PASSES=1 parley serve`, as a user starts it: two clients at once share the PyTorch
path's passes (their usage says the step is `tiled` and that a pass held both), and each gets the text it gets
alone from the same server."""

from __future__ import annotations

import argparse
import http.client
import json
import threading

import pytest

from parley.bench import serve as serve_bench

pytestmark = pytest.mark.slow

ASKS = [("Name three colours.", {"temperature": 0}),
        ("Write a short story about a lighthouse keeper.", {"temperature": 0.8, "seed": 5})]


def ask(server: serve_bench.Server, text: str, extra: dict) -> tuple[str, int, str]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=600)
    try:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": 16, "speculation": "off", **extra}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        assert resp.status == 200, answer
        parley = answer["usage"]["parley"]
        return answer["choices"][0]["message"]["content"], parley["batch"], parley["step"]
    finally:
        conn.close()


def test_two_clients_share_passes_and_get_their_solo_texts(monkeypatch) -> None:
    monkeypatch.setenv("PARLEY_NATIVE", "0")
    monkeypatch.setenv("PARLEY_SHARED_PASSES", "1")
    monkeypatch.setenv("PARLEY_CONTEXT", "512")
    parser = argparse.ArgumentParser()
    serve_bench.add_arguments(parser)
    with serve_bench.Server(parser.parse_args(["--quant", "none", "--timeout", "600"]), 2) as server:
        alone = [ask(server, text, extra)[0] for text, extra in ASKS]
        together: list = [None, None]
        start = threading.Barrier(2)

        def client(i: int) -> None:
            start.wait(timeout=600)
            together[i] = ask(server, *ASKS[i])

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=900)
            assert not t.is_alive()
    assert [text for text, _, _ in together] == alone
    assert max(batch for _, batch, _ in together) == 2, together
    assert {step for _, _, step in together} == {"tiled"}, together
