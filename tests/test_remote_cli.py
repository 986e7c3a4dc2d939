"""`parley generate --server URL` (or PARLEY_SERVER) answers through the remote backend, the key from the
environment; plain http beyond this machine is warned about, and a bad URL or key is a clear error."""

from __future__ import annotations

import pytest
from serve_support import real_engine, running_server

from parley.app import cli
from parley.engine.events import TextDelta
from parley.engine.params import GenerationParams
from parley.engine.remote import base_url, insecure_warning

KEY = "sk-cli-secret-0b7e"
PROMPT = "What is the capital of France?"


def test_plain_http_beyond_this_machine_is_warned_about():
    assert "plain http" in insecure_warning("http://10.1.2.3:8000/v1")
    assert "plain http" in insecure_warning("http://gpu-box.lan:8000/v1")
    for url in ("http://127.0.0.1:8000/v1", "http://localhost:11434/v1", "http://[::1]:8080/v1",
                "https://gpu-box.lan/v1"):
        assert insecure_warning(url) is None, url
    assert base_url("http://h:8000") == "http://h:8000/v1" and base_url("http://h:8000/v1/") == "http://h:8000/v1"


@pytest.mark.slow
def test_generate_through_the_server_with_the_key_from_the_environment(monkeypatch, capsys, tmp_path):
    expected = "".join(e.text for e in real_engine().session().reply(
        [{"role": "user", "content": PROMPT}], GenerationParams(temperature=0.0, max_new_tokens=10))
        if isinstance(e, TextDelta))
    with running_server(api_key=KEY) as (server, url):
        monkeypatch.setenv("PARLEY_SERVER", url)
        monkeypatch.delenv("PARLEY_API_KEY", raising=False)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        assert cli.main(["generate", "--temperature", "0", "--max-new-tokens", "10", PROMPT]) == 0
        out, err = capsys.readouterr()
        assert out == expected + "\n" and "warning" not in err and KEY not in err

        monkeypatch.setenv("PARLEY_API_KEY", "wrong")  # PARLEY_API_KEY comes before OPENAI_API_KEY
        assert cli.main(["generate", "--max-new-tokens", "2", PROMPT]) == 2
        err = capsys.readouterr().err
        assert "--api-key" in err and "Traceback" not in err
        key_file = tmp_path / "key"
        key_file.write_text(KEY + "\n")
        assert cli.main(["generate", "--server", url, "--model", "nope", "--api-key-file", str(key_file), PROMPT]) == 2
        assert "'nope' is not served" in capsys.readouterr().err
    assert cli.main(["generate", "--server", url, PROMPT]) == 2  # the server is gone
    assert "cannot reach" in capsys.readouterr().err
