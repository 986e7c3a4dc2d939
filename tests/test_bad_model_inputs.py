"""Every way a model reference or file can be wrong ends in one ModelLoadError that names the culprit and the fix."""

import json

import gguf
import pytest
from fakehub import FakeHub
from tiny_models import files_of, reference_model, tiny_config, write_gguf, write_model_dir

from parley.models.errors import ModelLoadError
from parley.models.loading import load_model
from parley.models.resolve import resolve
from parley.models.tokenizer import load_tokenizer

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    cfg = tiny_config("llama")
    return write_model_dir(tmp_path_factory.mktemp("tiny"), reference_model(cfg), cfg, shards=2)


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with FakeHub() as hub:
        hub.use(monkeypatch, tmp_path / "hf-cache")
        yield hub


def copy_dir(src, dst):
    dst.mkdir()
    for name, data in files_of(src).items():
        (dst / name).write_bytes(data)
    return dst


@pytest.mark.parametrize("ref", ["./no/such/model", "/no/such/model.gguf", "~/missing.gguf", "not a hub id"])
def test_missing_path(ref):
    with pytest.raises(ModelLoadError, match=r"no such file or directory.*hub id like"):
        resolve(ref)


def test_unknown_hub_id(hub):
    with pytest.raises(ModelLoadError, match=r"org/missing: no such model on the hub.*check the id"):
        resolve("org/missing")


def test_unknown_revision(hub, tiny_dir):
    hub.add_repo("org/tiny", files_of(tiny_dir))
    with pytest.raises(ModelLoadError, match=r"org/tiny@nope: the revision does not exist"):
        resolve("org/tiny@nope")


def test_offline_without_a_cached_copy(hub, tiny_dir, monkeypatch):
    hub.add_repo("org/tiny", files_of(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match=r"org/tiny@main is not in the Hugging Face cache and HF_HUB_OFFLINE=1"):
        resolve("org/tiny")
    assert not [r for r in hub.requests if "/org/tiny" in r[1]]


def test_interrupted_download_leaves_nothing_trusted(hub, tiny_dir, monkeypatch):
    """The connection drops on every try: the error says to run again, and the half-fetched snapshot is
    never used -- not even offline, where huggingface_hub would hand back the snapshot folder."""
    files = files_of(tiny_dir)
    hub.add_repo("org/tiny", files)
    shard = "model-00001-of-00002.safetensors"
    hub.cut_body(shard, after_bytes=100)
    monkeypatch.setattr("huggingface_hub.file_download.time.sleep", lambda s: None)
    with pytest.raises(ModelLoadError, match=r"org/tiny@main: download failed.*run again to resume"):
        resolve("org/tiny")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match=rf"(not in the Hugging Face cache|incomplete|{shard} is missing)"):
        resolve("org/tiny")

    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub.cut.clear()
    files_ok = resolve("org/tiny")
    assert (files_ok.path / shard).read_bytes() == files[shard]
    load_model(files_ok)


def test_unsupported_architecture_in_config(tiny_dir, tmp_path):
    d = copy_dir(tiny_dir, tmp_path / "neox")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt_neox"}))
    with pytest.raises(ModelLoadError, match=r"config.json: model_type 'gpt_neox' is not supported; "
                                             r"Parley runs llama, mistral, qwen2, qwen3"):
        load_model(resolve(str(d)))


def test_unsupported_architecture_in_gguf(tmp_path):
    cfg = tiny_config("llama")
    path = write_gguf(tmp_path / "m.gguf", reference_model(cfg), cfg)
    data = path.read_bytes().replace(b"general.architecture\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00llama",
                                     b"general.architecture\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00gpt_2")
    path.write_bytes(data)
    with pytest.raises(ModelLoadError, match=r"m.gguf: architecture 'gpt_2' is not supported; Parley runs llama"):
        load_model(resolve(str(path)))


@pytest.mark.parametrize("keep", [4, 60, -1000])
def test_truncated_safetensors(tiny_dir, tmp_path, keep):
    d = copy_dir(tiny_dir, tmp_path / "cut")
    shard = d / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:keep])
    with pytest.raises(ModelLoadError, match=r"model-00002-of-00002.safetensors: not a valid safetensors file.*"
                                             r"truncated or corrupted -- delete it and download the model again"):
        load_model(resolve(str(d)))


def test_missing_shard(tiny_dir, tmp_path):
    d = copy_dir(tiny_dir, tmp_path / "noshard")
    (d / "model-00001-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"weight file model-00001-of-00002.safetensors is missing"):
        resolve(str(d))


def test_pickled_weights_only(tiny_dir, tmp_path):
    d = copy_dir(tiny_dir, tmp_path / "pickle")
    for p in d.glob("*.safetensors*"):
        p.unlink()
    (d / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelLoadError, match=r"no \*.safetensors weights \(found pytorch_model.bin: "
                                             r"Parley never loads pickled weights\)"):
        resolve(str(d))


def test_gguf_with_unsupported_tensor_type(tmp_path):
    cfg = tiny_config("llama")
    path = write_gguf(tmp_path / "q81.gguf", reference_model(cfg), cfg,
                      override_type={"blk.1.ffn_up.weight": gguf.GGMLQuantizationType.Q8_1})
    with pytest.raises(ModelLoadError, match=r"q81.gguf: tensor blk.1.ffn_up.weight is stored as Q8_1, which "
                                             r"Parley cannot dequantize; use a GGUF of type F32, F16"):
        load_model(resolve(str(path)))


@pytest.mark.parametrize("keep", [3, 100, 3000])
def test_truncated_or_foreign_gguf(tmp_path, keep):
    cfg = tiny_config("llama")
    path = write_gguf(tmp_path / "cut.gguf", reference_model(cfg), cfg)
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(ModelLoadError, match=r"cut.gguf: (not a valid GGUF file, or truncated|a file that is not GGUF)"
                       ):
        load_model(resolve(str(path)))


def test_broken_tokenizer_json(tiny_dir, tmp_path):
    d = copy_dir(tiny_dir, tmp_path / "badtok")
    (d / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"tokenizer.json: cannot be read.*re-download"):
        load_tokenizer(resolve(str(d)))
