"""Damaged weight and tokenizer files end in one ModelLoadError naming the file and the fix, never a traceback.

The cases a probe of issue 25 found raising (RuntimeError, AttributeError, TypeError) or unclear (no file
named; NaN weights reported only as "the model produced no text")."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import reference_model, tiny_config, write_model_dir

from parley.models.errors import ModelLoadError
from parley.models.loading import load_model
from parley.models.resolve import resolve
from parley.models.tokenizer import load_tokenizer

pytest.importorskip("transformers")


@pytest.fixture
def model_dir(tmp_path):
    cfg = tiny_config("llama")
    return write_model_dir(tmp_path / "m", reference_model(cfg), cfg)


def rewrite(d, name: str, tensor: torch.Tensor) -> None:
    state = load_file(str(d / "model.safetensors"))
    assert name in state
    state[name] = tensor
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize(("name", "make", "words"), [
    ("model.embed_tokens.weight", lambda t: t.to(torch.int32), r"stored as int32, expected floating point"),
    ("model.norm.weight", lambda t: t > 0, r"stored as bool, expected floating point"),
    ("model.layers.1.mlp.up_proj.weight", lambda t: t.index_fill(0, torch.tensor([3]), float("nan")),
     r"holds NaN or infinite values"),
    ("model.layers.0.self_attn.q_proj.weight", lambda t: t.index_fill(1, torch.tensor([0]), float("inf")),
     r"holds NaN or infinite values"),
])
def test_bad_tensor_values_are_named(model_dir, name, make, words):
    state = load_file(str(model_dir / "model.safetensors"))
    rewrite(model_dir, name, make(state[name]))
    with pytest.raises(ModelLoadError, match=rf"{model_dir}: tensor {name.removeprefix('model.')} .*{words}"):
        load_model(resolve(str(model_dir)))


def test_a_malformed_shard_index_is_named(model_dir):
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["a"]}))
    with pytest.raises(ModelLoadError, match=r"model.safetensors.index.json: weight_map is a list"):
        load_model(resolve(str(model_dir)))


def test_an_odd_head_dim_names_the_config(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**cfg, "head_dim": 33}))
    with pytest.raises(ModelLoadError, match=rf"{model_dir / 'config.json'}: head_dim=33"):
        load_model(resolve(str(model_dir)))


@pytest.mark.parametrize("decoder", [{"0": "oops"}, {"x": {"content": "a"}}, ["a"], {"0": {"content": 5}}])
def test_bad_added_tokens_decoder_is_named(tmp_path, decoder):
    (tmp_path / "tokenizer.model").write_bytes(b"not read: the config is checked first")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    with pytest.raises(ModelLoadError, match=r"tokenizer_config.json: added_tokens_decoder entry"):
        load_tokenizer(resolve_dir(tmp_path))


def test_an_empty_vocabulary_is_named(tmp_path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.BPE()).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ModelLoadError, match=rf"{tmp_path}: the tokenizer's vocabulary is empty"):
        load_tokenizer(resolve_dir(tmp_path))


def resolve_dir(path):
    from parley.models.resolve import ModelFiles

    return ModelFiles(ref=str(path), kind="dir", path=path)
