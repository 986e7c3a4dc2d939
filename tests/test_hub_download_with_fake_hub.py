"""A hub id downloads only the files Parley reads, into the Hugging Face cache, and loads to the same logits."""

import pytest
import torch
from fakehub import FakeHub
from tiny_models import files_of, reference_model, tiny_config, write_model_dir

from parley.models.loading import load_model
from parley.models.resolve import resolve
from parley.models.tokenizer import load_tokenizer

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A sharded tiny llama published as org/tiny, plus files Parley must never fetch."""
    cfg = tiny_config("llama", tied=False)
    ref = reference_model(cfg)
    files = files_of(write_model_dir(tmp_path_factory.mktemp("src"), ref, cfg, shards=3))
    files["pytorch_model.bin"] = b"pickle: never downloaded"
    files["modeling_evil.py"] = b"import os"
    files["README.md"] = b"# tiny"
    return ref, files


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with FakeHub() as hub:
        hub.use(monkeypatch, tmp_path / "hf-cache")
        yield hub


def logits(model, ids):
    with torch.no_grad():
        return model(ids, torch.arange(ids.shape[1])[None], model.new_cache(32))


def test_download_sharded_model_and_match_source_logits(hub, tiny, tmp_path):
    ref, files = tiny
    sha = hub.add_repo("org/tiny", files)
    seen = []
    model_files = resolve("org/tiny", progress=seen.append)

    assert model_files.kind == "dir" and model_files.repo_id == "org/tiny" and model_files.revision == sha
    assert model_files.path.is_relative_to(tmp_path / "hf-cache")
    assert sorted(p.name for p in model_files.path.iterdir()) == sorted(
        n for n in files if n not in ("pytorch_model.bin", "modeling_evil.py", "README.md"))
    fetched = {path.rsplit("/", 1)[-1] for method, path in hub.requests if method == "GET" and "/resolve/" in path}
    assert not fetched & {"pytorch_model.bin", "modeling_evil.py", "README.md"}
    assert seen and seen[-1].done == seen[-1].total > 0 and seen[-1].unit == "B"

    ids = torch.randint(0, 259, (1, 16))
    torch.testing.assert_close(logits(load_model(model_files), ids), ref(ids).logits, atol=1e-5, rtol=1e-5)
    tok = load_tokenizer(model_files)
    assert tok.decode(tok.encode("héllo <|im_end|>")) == "héllo <|im_end|>"
    assert tok.stop_ids == {256, 258} and tok.eos_id == 258  # <|im_end|>, <|endoftext|>


def test_revision_pin_and_offline_reuse_of_the_cache(hub, tiny, monkeypatch):
    _, files = tiny
    old = hub.add_repo("org/tiny", files)
    hub.add_repo("org/tiny", {**files, "config.json": files["config.json"] + b" "})  # main moves on
    pinned = resolve(f"org/tiny@{old}")
    assert pinned.revision == old

    latest = resolve("org/tiny")
    assert latest.revision != old
    n_requests = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve("org/tiny").path == latest.path  # from the cache, no request
    assert resolve(f"org/tiny@{old}").path == pinned.path
    assert len(hub.requests) == n_requests


def test_interrupted_download_resumes_on_retry(hub, tiny, monkeypatch):
    """A connection dropped mid-file is resumed by huggingface_hub (Range request); the result is whole."""
    ref, files = tiny
    hub.add_repo("org/tiny", files)
    shard = "model-00002-of-00003.safetensors"
    hub.cut_body(shard, after_bytes=1000, times=1)
    monkeypatch.setattr("huggingface_hub.file_download.time.sleep", lambda s: None)
    model_files = resolve("org/tiny")
    assert hub.cut_times[shard] == 0  # the cut happened
    assert (model_files.path / shard).read_bytes() == files[shard]
    ids = torch.randint(0, 259, (1, 8))
    torch.testing.assert_close(logits(load_model(model_files), ids), ref(ids).logits, atol=1e-5, rtol=1e-5)
