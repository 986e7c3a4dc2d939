"""Every way a model reference or file can be wrong ends in one ModelLoadError that names the culprit and the fix."""

import json
import struct

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


# Each damaged config.json: (field, what it is set to, what the message must name). Every one is refused
# before anything is built: no absurd allocation, no ten-million-layer model, no ZeroDivisionError.
BAD_CONFIGS = [
    ("intermediate_size", 10**13, r"intermediate_size is 10000000000000; expected a whole number from 1 to"),
    ("vocab_size", 10**12, r"vocab_size is 1000000000000; expected a whole number"),
    ("max_position_embeddings", -5, r"max_position_embeddings is -5; expected a whole number"),
    ("hidden_size", -64, r"hidden_size is -64; expected a whole number"),
    ("hidden_size", 0, r"hidden_size is 0; expected a whole number"),
    ("hidden_size", "64", r"hidden_size is '64'; expected a whole number"),
    ("num_attention_heads", 0, r"num_attention_heads is 0; expected a whole number"),
    ("num_key_value_heads", 0, r"num_key_value_heads is 0; expected a whole number"),
    ("num_key_value_heads", 3, r"num_attention_heads \(4\) is not a multiple of num_key_value_heads \(3\)"),
    ("num_hidden_layers", 10_000_000, r"num_hidden_layers is 10000000; expected a whole number from 1 to 1024"),
    ("num_hidden_layers", [2], r"num_hidden_layers is \[2\]; expected a whole number"),
    ("num_hidden_layers", True, r"num_hidden_layers is True; expected a whole number"),
    ("rms_norm_eps", "tiny", r"rms_norm_eps is 'tiny'; expected a positive number"),
    ("rope_theta", -1.0, r"rope_theta is -1.0; expected a positive number"),
    ("vocab_size", None, r"vocab_size is missing"),
    # sane sizes that the weights contradict: caught by shape, before any tensor is placed
    ("vocab_size", 100_000, r"tensor (embed_tokens|lm_head).weight has shape \(259, 64\), the config implies "
                              r"\(100000, 64\)"),
    ("intermediate_size", 4096, r"has shape \(96, 64\), the config implies \(4096, 64\)"),
    ("num_hidden_layers", 3, r"tensor\(s\) missing, e.g. layers.2"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, r"config.json: rope_scaling type 'yarn' is not supported"),
    ("quantization_config", [1], r"quantization_config must be a JSON object"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD_CONFIGS, ids=[f"{f}={v!r}"[:40] for f, v, _ in BAD_CONFIGS])
def test_damaged_config_names_the_field(tiny_dir, tmp_path, field, value, message):
    d = copy_dir(tiny_dir, tmp_path / "cfg")
    cfg = json.loads((d / "config.json").read_text())
    cfg[field] = value
    if value is None:
        del cfg[field]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=message) as err:
        load_model(resolve(str(d)))
    assert str(d) in str(err.value)
    assert "config.json" in str(err.value) or "re-download" in str(err.value)


@pytest.mark.parametrize("content", ["[1, 2, 3]", '"llama"', "null", "{not json", "\xff\xfe"])
def test_config_that_is_not_an_object(tiny_dir, tmp_path, content):
    d = copy_dir(tiny_dir, tmp_path / "cfg")
    (d / "config.json").write_bytes(content.encode("latin-1"))
    with pytest.raises(ModelLoadError, match=r"config.json: (expected a JSON object of settings, found a|not valid "
                                             r"JSON).*re-download"):
        load_model(resolve(str(d)))


@pytest.mark.parametrize(("attr", "value", "message"), [
    ("max_position_embeddings", 0, r"metadata llama.context_length is 0; expected a whole number"),
    ("num_attention_heads", 0, r"metadata llama.attention.head_count is 0"),
    ("num_hidden_layers", 10_000_000, r"metadata llama.block_count is 10000000"),
    ("intermediate_size", 4_000_000_000, r"metadata llama.feed_forward_length is 4000000000"),
])
def test_damaged_gguf_metadata_names_the_key(tmp_path, attr, value, message):
    cfg = tiny_config("llama")
    model = reference_model(cfg)
    path = write_gguf(tmp_path / "bad.gguf", model, cfg)
    key = {"max_position_embeddings": b"llama.context_length", "num_attention_heads": b"llama.attention.head_count",
           "num_hidden_layers": b"llama.block_count", "intermediate_size": b"llama.feed_forward_length"}[attr]
    old = key + struct.pack("<II", 4, getattr(model.config, attr))  # a UINT32 value
    data = path.read_bytes()
    assert data.count(old) == 1
    path.write_bytes(data.replace(old, key + struct.pack("<II", 4, value)))
    with pytest.raises(ModelLoadError, match=message) as err:
        load_model(resolve(str(path)))
    assert "bad.gguf" in str(err.value) and "re-download" in str(err.value)


@pytest.mark.parametrize(("field", "value"), [("intermediate_size", 10**13), ("num_attention_heads", 0),
                                              ("hidden_size", "64")])
def test_generate_prints_one_line_for_a_damaged_config(tiny_dir, tmp_path, capsys, field, value):
    from parley.app.cli import main

    d = copy_dir(tiny_dir, tmp_path / "cfg")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, field: value}))
    for quant in ("none", "awq"):  # awq: refused before any quantization starts
        assert main(["generate", "hi", "--model", str(d), "--quant", quant]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("parley: error:") and field in err, err
