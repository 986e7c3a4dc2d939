"""AWQ's calibration text, by default: pile-val through the real huggingface_hub code when the hub answers
(here a fake hub on 127.0.0.1), the built-in corpus at once when it does not. Before, an offline first
run sat through huggingface_hub's retries (~23 s) before falling back."""

import json
import socket

import pytest
import zstandard
from fakehub import FakeHub

from parley.models.quantize import calibration


def encode(text: str) -> list[int]:
    return [len(w) for w in text.split()]  # a stand-in tokenizer: one id per word


def pile_file(n_docs: int) -> bytes:
    lines = [json.dumps({"text": f"document {i} " + "word " * (i % 7 + 3)}) for i in range(n_docs)]
    return zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode())


def test_pile_val_from_a_reachable_hub(monkeypatch, tmp_path):
    with FakeHub() as hub:
        hub.add_repo(f"datasets/{calibration.PILE_REPO}", {calibration.PILE_FILE: pile_file(200)})
        hub.use(monkeypatch, tmp_path)
        cal = calibration.load_calibration(encode, 4, 16)
        assert cal.description.startswith("pile-val")
        assert cal.tokens.shape == (4, 16)
        assert any(path.endswith(calibration.PILE_FILE) for _, path in hub.requests)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


def test_unreachable_hub_falls_back_without_retrying(monkeypatch, tmp_path):
    with FakeHub() as hub:
        hub.use(monkeypatch, tmp_path)  # an empty HF cache, online settings
    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", url)
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)

    downloads = []

    def download(*args, **kwargs):  # what huggingface_hub would do after its retries
        downloads.append(args)
        raise OSError("unreachable, after retrying")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", download)
    assert calibration.hub_unreachable() is not None
    cal = calibration.load_calibration(encode, 4, 16)
    assert cal.description.startswith("built-in corpus")
    assert downloads == [], "the download (and its retries) ran although the hub was known to be unreachable"
    with pytest.raises(OSError, match="after retrying"):  # asked for by name, pile-val is still tried
        calibration.load_calibration(encode, 4, 16, "pile")
