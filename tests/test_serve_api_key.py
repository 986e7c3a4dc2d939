"""The API key must match exactly, compared in constant time, and comes from PARLEY_API_KEY or a file, never argv.

A prefix comparison (`Bearer KEY...anything` accepted) passes tests that send no key or a wrong one; these
send the key with a suffix, without its last character, in another case and with whitespace in it (trailing whitespace
on the wire is not part of a header value in HTTP)."""

from __future__ import annotations

import argparse
import socket

import pytest
from serve_fake_engine import serve_engine
from serve_support import running_server

from parley.app.server import api as serve
from parley.app.server import keys

KEY = "sk-Test-7f3a9c"


@pytest.fixture(scope="module")
def url():
    with running_server(serve_engine(), api_key=KEY) as (_, base):
        yield base


def status(url: str, authorization: str) -> int:
    """The status of GET /v1/models sent byte for byte (httpx refuses header values with edge whitespace)."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {authorization}\r\n"
                  "Connection: close\r\n\r\n".encode())
        return int(s.makefile("rb").readline().split()[1])


def test_the_exact_key_is_accepted(url):
    assert status(url, f"Bearer {KEY}") == 200


@pytest.mark.parametrize("given", [
    f"Bearer {KEY}x", f"Bearer {KEY}{KEY}", f"Bearer {KEY[:-1]}", f"Bearer {KEY.swapcase()}",
    f"Bearer {KEY.upper()}", f"Bearer  {KEY}", f"Bearer {KEY} x", f"Bearer {KEY}\tx", f"Bearer\t{KEY}",
    f"bearer {KEY}", KEY, "Bearer", f"Bearer {KEY[:-1]} ",
])
def test_anything_but_the_exact_key_is_refused(url, given):
    assert status(url, given) == 401, repr(given)


def test_the_comparison_is_constant_time(url, monkeypatch):
    """Through hmac.compare_digest on the whole header (a `==` or startswith leaks the key's length or prefix
    through timing)."""
    seen = []
    real = serve.hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(serve.hmac, "compare_digest", spy)
    assert status(url, f"Bearer {KEY}z") == 401
    assert seen and seen[-1] == (f"Bearer {KEY}z".encode(), f"Bearer {KEY}".encode())


def args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"api_key": None, "api_key_file": None, **kw})


def test_key_from_the_environment_or_a_file(monkeypatch, tmp_path):
    monkeypatch.delenv("PARLEY_API_KEY", raising=False)
    assert keys.api_key(args()) is None
    monkeypatch.setenv("PARLEY_API_KEY", KEY)
    assert keys.api_key(args()) == KEY
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    assert keys.api_key(args(api_key_file=str(key_file))) == "sk-from-file"
    with pytest.raises(ValueError, match="visible to every user"):  # never from argv (ps, shell history)
        keys.api_key(args(api_key="sk-flag", api_key_file=str(key_file)))
    with pytest.raises(ValueError, match="api-key-file .*cannot read"):
        keys.api_key(args(api_key_file=str(tmp_path / "missing")))
    key_file.write_text("\n")
    with pytest.raises(ValueError, match="non-empty"):
        keys.api_key(args(api_key_file=str(key_file)))
