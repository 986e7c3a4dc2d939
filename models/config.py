"""What a model is, as numbers: read from a Hugging Face `config.json` or from GGUF metadata."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


class ConfigError(ValueError):
    """A model's configuration that Parley cannot run; the message says which file and what to do."""


@dataclass
class ModelConfig:
    arch: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    head_dim: int = 0  # 0: dim // n_heads
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_seq_len: int = 4096
    tie_embeddings: bool = False
    qkv_bias: bool = False  # qwen2
    qk_norm: bool = False  # qwen3
    quantization: dict[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.dim // self.n_heads
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], source: str = "config.json") -> ModelConfig:
        arch = cfg.get("model_type", "")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"{source}: model_type {arch!r} is not supported; Parley runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}. Pick a model of one of those families."
            )
        n_heads = cfg["num_attention_heads"]
        rope_scaling = cfg.get("rope_scaling") or None
        rope_theta = cfg.get("rope_theta")
        # transformers 5 moved rope settings into `rope_parameters`.
        rope_params = cfg.get("rope_parameters") or {}
        if rope_theta is None:
            rope_theta = rope_params.get("rope_theta", 10000.0)
        if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
            rope_scaling = rope_params
        return cls(
            arch=arch,
            vocab_size=cfg["vocab_size"],
            dim=cfg["hidden_size"],
            n_layers=cfg["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
            intermediate_size=cfg["intermediate_size"],
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
            norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            max_seq_len=cfg.get("max_position_embeddings", 4096),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=arch == "qwen3",
            quantization=cfg.get("quantization_config"),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            cfg = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no config.json; a model directory needs one") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e}); re-download the model") from None
        return cls.from_hf(cfg, source=str(path))

    @classmethod
    def from_gguf(cls, source: str | Path | Any) -> ModelConfig:
        """From a GGUF file's metadata (`source`: its path, or a `gguf_weights.GGUFFile` already opened).

        GGUF has no flag for tied embeddings or qkv bias: they show as a missing `output.weight` and a
        present `blk.0.attn_q.bias`.
        """
        from .gguf_weights import open_gguf

        file = open_gguf(source) if isinstance(source, (str, Path)) else source
        meta, path = file.metadata, file.path
        arch = meta.get("general.architecture", "")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"{path}: architecture {arch!r} is not supported; Parley runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}. Pick a GGUF of one of those families."
            )
        shapes = {t.name: t.shape for t in file.tensors}
        names = set(shapes)

        def get(key: str, default: Any = None) -> Any:
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise ConfigError(f"{path}: metadata {arch}.{key} is missing; the file is incomplete, re-download it")
            return value

        n_heads = int(get("attention.head_count"))
        dim = int(get("embedding_length"))
        # the embedding's rows are the truth: some converters pad the vocabulary beyond the token list
        vocab = shapes.get("token_embd.weight", (meta.get(f"{arch}.vocab_size") or 0,))[0]
        rope_scaling = None
        if meta.get(f"{arch}.rope.scaling.type") == "linear":
            rope_scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
        return cls(
            arch=arch,
            vocab_size=int(vocab),
            dim=dim,
            n_layers=int(get("block_count")),
            n_heads=n_heads,
            n_kv_heads=int(get("attention.head_count_kv", n_heads)),
            intermediate_size=int(get("feed_forward_length")),
            head_dim=int(get("attention.key_length", dim // n_heads)),
            norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_scaling=rope_scaling,
            max_seq_len=int(get("context_length", 4096)),
            tie_embeddings="output.weight" not in names,
            qkv_bias="blk.0.attn_q.bias" in names,
            qk_norm="blk.0.attn_q_norm.weight" in names,
        )

    def to_hf(self) -> dict[str, Any]:
        """The `config.json` transformers and vLLM expect for this model."""
        cfg: dict[str, Any] = {
            "architectures": [
                {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[self.arch]
            ],
            "model_type": self.arch,
            "vocab_size": self.vocab_size,
            "hidden_size": self.dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "intermediate_size": self.intermediate_size,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_seq_len,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float16",
        }
        if self.arch == "llama":
            cfg["attention_bias"] = self.qkv_bias
        if self.quantization:
            cfg["quantization_config"] = self.quantization
        return cfg
