"""What a model is, as numbers: read from a Hugging Face `config.json` or from GGUF metadata."""

from __future__ import annotations

import json
import math
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import families
from .errors import ModelLoadError, printable
from .families import SUPPORTED_ARCHITECTURES

ROPE_TYPES = ("default", "linear", "llama3")  # what transformer.rope_frequencies implements

# Sane upper bounds, checked before anything is built: a damaged or hostile config must fail with a
# message, not by trying to allocate terabytes or building ten million layers. Each is far above any
# released model of the families Parley runs.
LIMITS = {
    "vocab_size": 1 << 22,  # 4M tokens (largest released: ~256k)
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 18,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 4096,
    "max_position_embeddings": 1 << 24,  # 16M positions
}


class ConfigError(ModelLoadError):
    """A model's configuration that Parley cannot run; the message says which file, which field and what to do."""


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 3, 4, 4


def _shown(value: Any) -> str:
    """A config value as an error message shows it: short (a 10,000-character string, a list nested 50,000
    deep) and with control characters escaped."""
    return printable(_REPR.repr(value))


def _whole(value: Any, name: str, source: str, limit: int) -> int:
    """`value` as a size in [1, limit], or a ConfigError naming the field."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ConfigError(
            f"{source}: {name} is {_shown(value)}; expected a whole number from 1 to {limit}. The config is damaged "
            "or not a model config: re-download the model, or fix that field"
        )
    return value


def _positive(value: Any, name: str, source: str) -> float:
    """`value` as a finite positive float, or a ConfigError naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"{source}: {name} is {_shown(value)}; expected a positive number. The config is damaged: re-download the "
            "model, or fix that field"
        )
    return float(value)


def _sliding_layers(cfg: dict[str, Any], n_layers: int, source: str) -> tuple[int, ...]:
    """Each layer's window (0: global) of a `sliding_window` family, from its config (or what GGUF metadata
    implies): `layer_types`, else every `sliding_window_pattern`-th layer global."""
    window = _whole(cfg.get("sliding_window", 512), "sliding_window", source, LIMITS["max_position_embeddings"])
    types = cfg.get("layer_types")
    if types is None:
        key = "sliding_window_pattern" if "sliding_window_pattern" in cfg else "_sliding_window_pattern"
        pattern = _whole(cfg.get(key, 6), key.lstrip("_"), source, 1 << 20)
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or \
            not all(t in ("full_attention", "sliding_attention") for t in types if isinstance(t, str)) or \
            not all(isinstance(t, str) for t in types):
        raise ConfigError(f"{source}: layer_types must list full_attention / sliding_attention for each of the "
                          f"{n_layers} layers; fix or re-download the config")
    return tuple(window if t == "sliding_attention" else 0 for t in types)


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
    # What the model definition switches on; each family's are in families.py (all off: the llama block)
    qkv_bias: bool = False  # biases on q/k/v
    qk_norm: bool = False  # an RMSNorm on each head's q and k before rotation
    sandwich_norms: bool = False  # a norm after attention and after the MLP too, before each residual add
    norm_unit_offset: bool = False  # checkpoints store w for a gain of (1 + w); the model holds 1 + w
    mlp_act: str = "silu"  # "gelu_tanh": GeGLU
    embed_scale: bool = False  # embeddings multiplied by sqrt(dim), rounded to the weights' dtype
    query_scale: float = 0.0  # query_pre_attn_scalar ** -0.5; 0: head_dim ** -0.5
    layer_windows: tuple[int, ...] = ()  # per layer: 0 global, else sliding window w (keys p - w < j <= p)
    rope_local_theta: float = 0.0  # rope base of sliding-window layers; 0: rope_theta
    quantization: dict[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.n_heads <= 0 or self.n_kv_heads <= 0:
            raise ConfigError(f"n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}: both must be positive")
        if self.head_dim == 0:
            self.head_dim = self.dim // self.n_heads
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim}: rotary embeddings need a positive, even head size")
        if not any(self.layer_windows):  # all global (also after `replace(config, n_layers=...)`)
            self.layer_windows = (0,) * self.n_layers
        self.layer_windows = tuple(self.layer_windows)
        if len(self.layer_windows) != self.n_layers:
            raise ConfigError(f"{len(self.layer_windows)} layer windows for {self.n_layers} layers")

    @property
    def local_rope(self) -> bool:
        """Whether sliding-window layers rotate with a base of their own (Gemma 3's): the model then holds their
        frequencies as `inv_freq_local` beside `inv_freq`."""
        return any(self.layer_windows) and bool(self.rope_local_theta)

    @property
    def family(self) -> families.Family:
        return families.family(self.arch)

    @classmethod
    def from_hf(cls, cfg: Any, source: str = "config.json") -> ModelConfig:
        """From a parsed `config.json`; every size is checked against LIMITS first, naming the field at fault."""
        if not isinstance(cfg, dict):
            raise ConfigError(f"{source}: expected a JSON object of settings, found a {type(cfg).__name__}; "
                              "the file is damaged or not a model config: re-download the model")
        arch = cfg.get("model_type", "")
        if not isinstance(arch, str):
            raise ConfigError(f"{source}: model_type is a {type(arch).__name__}, expected a name such as \"llama\"; "
                              "fix or re-download the config")
        family = families.by_model_type(arch)
        if family is None or not family.runs:
            raise ConfigError(
                f"{source}: model_type {_shown(arch)} is not supported; Parley runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}. Pick a model of one of those families."
            )
        if family.text_config and isinstance(cfg.get("text_config"), dict):  # the multimodal wrapper's text model
            cfg = {**cfg["text_config"], "model_type": family.model_types[0]}
        arch = family.name

        def size(name: str, default: Any = None) -> int:
            value = cfg.get(name)
            if value is None:
                if default is None:
                    raise ConfigError(f"{source}: {name} is missing; the config is incomplete, re-download the model")
                value = default
            return _whole(value, name, source, LIMITS[name])

        dim = size("hidden_size")
        n_heads = size("num_attention_heads")
        n_kv_heads = size("num_key_value_heads", n_heads)
        if n_heads % n_kv_heads:
            raise ConfigError(f"{source}: num_attention_heads ({n_heads}) is not a multiple of num_key_value_heads "
                              f"({n_kv_heads}); the config is damaged, re-download the model")
        rope_scaling = cfg.get("rope_scaling") or None
        rope_theta = cfg.get("rope_theta")
        # transformers 5 moved rope settings into `rope_parameters`.
        rope_params = cfg.get("rope_parameters") or {}
        if not isinstance(rope_params, dict) or (rope_scaling is not None and not isinstance(rope_scaling, dict)):
            raise ConfigError(f"{source}: rope_scaling / rope_parameters must be JSON objects; fix or re-download "
                              "the config")
        local_theta = cfg.get("rope_local_base_freq")
        if family.sliding_window and isinstance(rope_params.get("full_attention"), dict):  # per layer type
            local_theta = (rope_params.get("sliding_attention") or {}).get("rope_theta", local_theta)
            rope_params = rope_params["full_attention"]
        if rope_theta is None:
            rope_theta = rope_params.get("rope_theta", family.rope_theta)
        if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
            rope_scaling = rope_params
        if rope_scaling is not None:
            kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
            if kind not in ROPE_TYPES:
                raise ConfigError(f"{source}: rope_scaling type {_shown(kind)} is not supported "
                                  f"({', '.join(ROPE_TYPES)} are); use a model of another configuration")
            if kind != "default":
                _positive(rope_scaling.get("factor"), "rope_scaling.factor", source)
            if kind == "llama3":  # what transformer.rope_frequencies reads (the two factors have defaults)
                _positive(rope_scaling.get("original_max_position_embeddings"),
                          "rope_scaling.original_max_position_embeddings", source)
                low, high = (_positive(rope_scaling.get(f"{name}_freq_factor", default),
                                       f"rope_scaling.{name}_freq_factor", source)
                             for name, default in (("low", 1.0), ("high", 4.0)))
                if high <= low:
                    raise ConfigError(f"{source}: rope_scaling.high_freq_factor must exceed low_freq_factor; fix "
                                      "or re-download the config")
        quantization = cfg.get("quantization_config")
        if quantization is not None and not isinstance(quantization, dict):
            raise ConfigError(f"{source}: quantization_config must be a JSON object, found "
                              f"{type(quantization).__name__}; fix or re-download the config")
        n_layers = size("num_hidden_layers")
        switches: dict[str, Any] = family.block_switches()
        if family.sliding_window:
            switches["layer_windows"] = _sliding_layers(cfg, n_layers, source)
            switches["rope_local_theta"] = _positive(local_theta or 10000.0, "rope_local_base_freq", source)
        if family.query_pre_attn_scalar:
            scalar = _positive(cfg.get("query_pre_attn_scalar", 256), "query_pre_attn_scalar", source)
            switches["query_scale"] = scalar ** -0.5
        if cfg.get("final_logit_softcapping") or cfg.get("attn_logit_softcapping"):
            raise ConfigError(f"{source}: logit soft-capping is not supported; use a model without it")
        return cls(
            arch=arch,
            vocab_size=size("vocab_size"),
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            intermediate_size=size("intermediate_size"),
            head_dim=size("head_dim", max(dim // n_heads, 1)),
            norm_eps=_positive(cfg.get("rms_norm_eps", 1e-6), "rms_norm_eps", source),
            rope_theta=_positive(rope_theta, "rope_theta", source),
            rope_scaling=rope_scaling,
            max_seq_len=size("max_position_embeddings", 4096),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", family.tie_embeddings)),
            qkv_bias=family.qkv_bias or bool(cfg.get("attention_bias", False)),
            qk_norm=family.qk_norm,
            quantization=quantization,
            **switches,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            cfg = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no config.json; a model directory needs one") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not valid JSON ({e}); re-download the model") from None
        except RecursionError:
            raise ConfigError(f"{path}: nests too deeply to be a model config; re-download the model") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot be read ({e.strerror}); check its permissions") from None
        try:
            return cls.from_hf(cfg, source=str(path))
        except ConfigError as e:  # a value only the dataclass checks (e.g. an odd head_dim): name the file too
            if str(e).startswith(str(path)):
                raise
            raise ConfigError(f"{path}: {e}; fix or re-download the config") from None

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
        family = families.by_gguf_arch(arch)
        if family is None or not family.runs:
            raise ConfigError(
                f"{path}: architecture {_shown(arch)} is not supported; Parley runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}. Pick a GGUF of one of those families."
            )
        shapes = {t.name: t.shape for t in file.tensors}
        names = set(shapes)

        def get(key: str, default: Any = None) -> Any:
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise ConfigError(f"{path}: metadata {arch}.{key} is missing; the file is incomplete, re-download it")
            return value

        def size(key: str, limit_of: str, default: Any = None) -> int:
            value = get(key, default)
            if isinstance(value, list) and value and key == "feed_forward_length":
                value = max(value)  # per-layer sizes; all equal in the families Parley runs
            return _whole(value, f"metadata {arch}.{key}", str(path), LIMITS[limit_of])

        n_heads = size("attention.head_count", "num_attention_heads")
        dim = size("embedding_length", "hidden_size")
        # the embedding's rows are the truth: some converters pad the vocabulary beyond the token list
        vocab = shapes.get("token_embd.weight", (meta.get(f"{arch}.vocab_size"),))[0]
        rope_scaling = None
        if meta.get(f"{arch}.rope.scaling.type") == "linear":
            rope_scaling = {"rope_type": "linear",
                            "factor": _positive(get("rope.scaling.factor"), f"{arch}.rope.scaling.factor", str(path))}
        n_kv_heads = size("attention.head_count_kv", "num_key_value_heads", n_heads)
        if n_heads % n_kv_heads:
            raise ConfigError(f"{path}: metadata {arch}.attention.head_count ({n_heads}) is not a multiple of "
                              f"{arch}.attention.head_count_kv ({n_kv_heads}); the file is damaged, re-download it")
        n_layers = size("block_count", "num_hidden_layers")
        head_dim = size("attention.key_length", "head_dim", max(dim // n_heads, 1))
        switches: dict[str, Any] = family.block_switches()
        if family.sliding_window:  # llama.cpp hard-codes what the HF config states: 5 sliding layers, then 1 global
            window = _whole(get("attention.sliding_window", 512), f"metadata {arch}.attention.sliding_window",
                            str(path), LIMITS["max_position_embeddings"])
            switches["layer_windows"] = _sliding_layers({"sliding_window": window}, n_layers, str(path))
            switches["rope_local_theta"] = 10000.0
        if family.query_pre_attn_scalar:  # llama.cpp scales by the key length
            switches["query_scale"] = float(head_dim) ** -0.5
        return cls(
            arch=family.name,
            vocab_size=_whole(vocab, "the vocabulary size (token_embd.weight rows)", str(path), LIMITS["vocab_size"]),
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            intermediate_size=size("feed_forward_length", "intermediate_size"),
            head_dim=head_dim,
            norm_eps=_positive(get("attention.layer_norm_rms_epsilon", 1e-6),
                               f"metadata {arch}.attention.layer_norm_rms_epsilon", str(path)),
            rope_theta=_positive(get("rope.freq_base", 10000.0), f"metadata {arch}.rope.freq_base", str(path)),
            rope_scaling=rope_scaling,
            max_seq_len=size("context_length", "max_position_embeddings", 4096),
            tie_embeddings="output.weight" not in names,
            qkv_bias="blk.0.attn_q.bias" in names,
            qk_norm="blk.0.attn_q_norm.weight" in names,
            **switches,
        )

    def to_hf(self) -> dict[str, Any]:
        """The `config.json` transformers and vLLM expect for this model."""
        family = self.family
        cfg: dict[str, Any] = {
            "architectures": [family.hf_class],
            "model_type": family.model_types[0],
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
        if not family.qkv_bias:  # (qwen2's biases go without saying)
            cfg["attention_bias"] = self.qkv_bias
        if self.mlp_act == "gelu_tanh":  # GeGLU, as Gemma's configs name it
            del cfg["hidden_act"]
            cfg["hidden_activation"] = "gelu_pytorch_tanh"
        if family.query_pre_attn_scalar:
            cfg["query_pre_attn_scalar"] = round(self.query_scale ** -2)
        if family.sliding_window:
            windows = [w for w in self.layer_windows if w]
            cfg.update(sliding_window=windows[0] if windows else None,
                       layer_types=["sliding_attention" if w else "full_attention" for w in self.layer_windows],
                       rope_local_base_freq=self.rope_local_theta, final_logit_softcapping=None,
                       attn_logit_softcapping=None)
        if self.quantization:
            cfg["quantization_config"] = self.quantization
        return cfg
