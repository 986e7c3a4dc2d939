"""Random weights of real shapes, for speed and memory figures where no real model of that size can be brought.

A shape is written once to disk, as people's models come: a bf16 safetensors checkpoint (one shard per layer,
drawn tensor by tensor from a fixed seed, so an 8B shape never needs its 32 GB of fp32 in memory), then from
that same checkpoint an INT4 folder in the AWQ format the loader reads (round to nearest, tensor by tensor:
the same layout, kernels and bytes as a real AWQ model) and, for llama.cpp, a BF16 GGUF and its Q4_0 / Q4_K_M
quantizations. Speed and memory are honest on random weights; quality is not.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from ..cache_files import cache_dir, replacing

SEED = 0
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
RANDOM_SHAPES: dict[str, dict] = {
    "llama-3.2-1b": dict(arch="llama", vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                         head_dim=64, intermediate_size=8192, tie_embeddings=True, rope_theta=500000.0,
                         rope_scaling=LLAMA3_ROPE),
    "qwen2.5-1.5b": dict(arch="qwen2", vocab_size=151936, dim=1536, n_layers=28, n_heads=12, n_kv_heads=2,
                         intermediate_size=8960, tie_embeddings=True, qkv_bias=True, rope_theta=1000000.0,
                         norm_eps=1e-6),
    "llama-3.1-8b": dict(arch="llama", vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                         intermediate_size=14336, rope_theta=500000.0, rope_scaling={**LLAMA3_ROPE, "factor": 8.0}),
    "smollm2-135m": dict(arch="llama", vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3,
                         intermediate_size=1536, tie_embeddings=True, rope_theta=100000.0),  # the embedded model's
    "llama-2-7b": dict(arch="llama", vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                       intermediate_size=11008),  # what `7b` was: multi-head attention, no longer what people run
    "small": dict(arch="llama", vocab_size=49152, dim=256, n_layers=2, n_heads=4, n_kv_heads=2,
                  intermediate_size=512, tie_embeddings=True),  # for tests
}
LLAMA_CPP_TYPES = ("Q4_0", "Q4_K_M")  # what llama.cpp users run, quantized by llama-quantize from the same file


def shape_config(shape: str):
    from ..models.config import ModelConfig

    return ModelConfig(max_seq_len=8192, **RANDOM_SHAPES[shape])


def root(shape: str) -> Path:
    """This shape's folder in the Parley cache: bf16/, int4-g128/, gguf/."""
    return cache_dir("random") / f"{shape}-seed{SEED}"


def _draw(name: str, shape: tuple[int, ...], std: float) -> torch.Tensor:
    """One tensor of N(0, std) in bf16, from a generator seeded by SEED and the tensor's name (any order, any
    subset gives the same values)."""
    seed = int.from_bytes(hashlib.sha256(f"{SEED}:{name}".encode()).digest()[:8], "little") >> 1
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * std).to(torch.bfloat16)


def _layer_tensors(config, i: int) -> Iterator[tuple[str, torch.Tensor]]:
    d, hd, f = config.dim, config.head_dim, config.intermediate_size
    q, kv = config.n_heads * hd, config.n_kv_heads * hd
    p = f"model.layers.{i}."
    yield p + "input_layernorm.weight", torch.ones(d, dtype=torch.bfloat16)
    yield p + "post_attention_layernorm.weight", torch.ones(d, dtype=torch.bfloat16)
    for name, out, inp in (("self_attn.q_proj", q, d), ("self_attn.k_proj", kv, d), ("self_attn.v_proj", kv, d),
                           ("self_attn.o_proj", d, q), ("mlp.gate_proj", f, d), ("mlp.up_proj", f, d),
                           ("mlp.down_proj", d, f)):
        yield p + name + ".weight", _draw(p + name, (out, inp), inp ** -0.5)
        if config.qkv_bias and name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            yield p + name + ".bias", _draw(p + name + ".bias", (out,), 0.02)


def _shards(config) -> Iterator[tuple[str, Callable[[], Iterator[tuple[str, torch.Tensor]]]]]:
    """(file name, its tensors) of the checkpoint: the embedding, one shard per layer, the final norm and head."""
    def top() -> Iterator[tuple[str, torch.Tensor]]:
        yield "model.embed_tokens.weight", _draw("embed", (config.vocab_size, config.dim), 0.02)

    def last() -> Iterator[tuple[str, torch.Tensor]]:
        yield "model.norm.weight", torch.ones(config.dim, dtype=torch.bfloat16)
        if not config.tie_embeddings:
            yield "lm_head.weight", _draw("lm_head", (config.vocab_size, config.dim), config.dim ** -0.5)

    n = config.n_layers + 2
    yield f"model-00001-of-{n:05d}.safetensors", top
    for i in range(config.n_layers):
        yield f"model-{i + 2:05d}-of-{n:05d}.safetensors", lambda i=i: _layer_tensors(config, i)
    yield f"model-{n:05d}-of-{n:05d}.safetensors", last


def _write_folder(out: Path, config_json: dict, shards: Iterator[tuple[str, dict[str, torch.Tensor]]],
                  tokenizer: bool = True) -> Path:
    """A sharded safetensors folder written shard by shard into a temporary folder renamed at the end."""
    from safetensors.torch import save_file

    with replacing(out) as tmp:
        tmp.mkdir()
        weight_map = {}
        for file, tensors in shards:
            save_file(tensors, str(tmp / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, file))
        (tmp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        (tmp / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
        if tokenizer:
            _tokenizer(tmp)
    return out


def _tokenizer(folder: Path) -> None:
    """The embedded model's tokenizer files (49,152 ids: they fit every shape's vocabulary), so the folder runs
    as any model does: `parley generate --model FOLDER`."""
    from ..models.quantize.cache import tokenizer_files
    from ..models.resolve import resolve

    if not (folder / "tokenizer.json").is_file():
        tokenizer_files(resolve(None), folder)


def checkpoint(shape: str, log: Callable[[str], None] = lambda s: None, tokenizer: bool = True) -> Path:
    """The bf16 safetensors checkpoint of `shape` (written on first use, one layer in memory at a time).
    `tokenizer=False` leaves out the embedded model's tokenizer files (a GPU check's bare machine has no
    embedded model and loads weights only)."""
    out = root(shape) / "bf16"
    if (out / "config.json").is_file():
        if tokenizer:
            _tokenizer(out)
        return out
    config = shape_config(shape)
    log(f"writing random bf16 weights of {shape} to {out}")
    hf = {**config.to_hf(), "torch_dtype": "bfloat16"}
    return _write_folder(out, hf, ((file, dict(tensors())) for file, tensors in _shards(config)), tokenizer)


def _read(folder: Path) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
    """(shard file, its tensors) of a sharded folder, one shard in memory at a time."""
    from safetensors.torch import load_file

    from ..models.resolve import weight_files

    for file in weight_files(folder):
        yield file, load_file(str(folder / file))


def int4_folder(shape: str, group: int = 128, log: Callable[[str], None] = lambda s: None) -> Path:
    """The checkpoint's decoder linears rounded to nearest INT4 (groups of `group`, or 64 where the input does not
    divide: the 576-wide model), as an AWQ GEMM folder; every other tensor fp16, as AutoAWQ writes them."""
    from ..models.quantize.checkpoint import quantization_config
    from ..models.quantize.int4_linear import LINEAR_NAMES
    from ..models.quantize.pack import quantize_weight

    src = checkpoint(shape, log)
    config = shape_config(shape)
    group = group if config.dim % group == 0 and config.intermediate_size % group == 0 else 64
    out = root(shape) / f"int4-g{group}"
    if (out / "config.json").is_file():
        _tokenizer(out)
        return out
    log(f"rounding {shape} to INT4 (groups of {group}) into {out}")

    def shards() -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
        for file, tensors in _read(src):
            packed = {}
            for name, t in tensors.items():
                base = name.removesuffix(".weight")
                if name.endswith(".weight") and base.rpartition(".")[2] in LINEAR_NAMES:
                    qweight, qzeros, scales = quantize_weight(t.float(), group)
                    packed.update({base + ".qweight": qweight, base + ".qzeros": qzeros, base + ".scales": scales})
                else:
                    packed[name] = t.half()
            yield file, packed

    hf = {**config.to_hf(), "quantization_config": quantization_config(group)}
    return _write_folder(out, hf, shards())


# --- llama.cpp's files -----------------------------------------------------------------------------------

def permute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """convert_hf_to_gguf's `permute` of llama q/k rows (halves -> adjacent pairs); gguf_weights undoes it."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def write_gguf(src: Path, config, out: Path) -> Path:
    """A BF16 GGUF of the checkpoint `src`, streamed tensor by tensor, with a synthetic vocabulary of the model's
    size (llama-bench never reads text; llama.cpp needs one to load)."""
    with replacing(out) as tmp:
        _write_gguf(src, config, tmp)
    return out


def _write_gguf(src: Path, config, path: Path) -> None:
    import gguf
    import numpy as np
    from safetensors import safe_open

    from ..models.gguf_weights import hf_to_gguf_name
    from ..models.resolve import weight_files
    from ..models.transformer import rope_frequencies

    files = [src / f for f in weight_files(src)]
    names = [(f, k) for f in files for k in safe_open(f, framework="pt").keys()]  # noqa: SIM118
    w = gguf.GGUFWriter(str(path), config.arch)
    w.add_name(f"random {src.parent.name}")
    w.add_context_length(config.max_seq_len)
    w.add_embedding_length(config.dim)
    w.add_block_count(config.n_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.n_heads)
    w.add_head_count_kv(config.n_kv_heads)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_rope_dimension_count(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.norm_eps)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(config.vocab_size)])
    w.add_token_scores([0.0] * config.vocab_size)
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (config.vocab_size - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    permuted = config.family.gguf_permuted_qk  # q/k rows as llama.cpp's converter writes them
    rope_freqs = None
    if config.rope_scaling:  # llama3 scaling as convert_hf_to_gguf stores it: per-frequency divisors
        from dataclasses import replace

        rope_freqs = (rope_frequencies(replace(config, rope_scaling=None)) / rope_frequencies(config)).float()
        w.add_tensor_info("rope_freqs.weight", list(rope_freqs.shape), np.dtype(np.float32), rope_freqs.numel() * 4)
    shapes = {}
    for f, k in names:
        with safe_open(f, framework="pt") as sf:
            shape = sf.get_slice(k).get_shape()
        shapes[k] = shape
        kind = gguf.GGMLQuantizationType.BF16 if len(shape) == 2 else gguf.GGMLQuantizationType.F32
        nbytes = int(np.prod(shape)) * (2 if len(shape) == 2 else 4)
        w.add_tensor_info(hf_to_gguf_name(k.removeprefix("model."), config.arch),
                          shape if len(shape) == 2 else list(shape),
                          np.dtype(np.uint16 if len(shape) == 2 else np.float32), nbytes,
                          raw_dtype=kind if len(shape) == 2 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    if rope_freqs is not None:
        w.write_tensor_data(rope_freqs.numpy())
    for f in files:
        with safe_open(f, framework="pt") as sf:
            for k in sf.keys():  # noqa: SIM118
                t = sf.get_tensor(k)
                if permuted and ".q_proj." in k:
                    t = permute_rotary(t, config.n_heads)
                elif permuted and ".k_proj." in k:
                    t = permute_rotary(t, config.n_kv_heads)
                t = t.contiguous()
                w.write_tensor_data(t.view(torch.int16).numpy().view(np.uint16) if t.dim() == 2
                                    else t.float().numpy())
    w.close()


def llama_cpp_files(shape: str, quantize: str, log: Callable[[str], None] = lambda s: None,
                    threads: int = 2) -> dict[str, Path] | dict[str, str]:
    """{type: GGUF} for each of LLAMA_CPP_TYPES, quantized by `quantize` (llama.cpp's llama-quantize) from a BF16
    GGUF of the same checkpoint Parley's INT4 folder came from; {"error": ...} when llama-quantize fails."""
    folder = root(shape) / "gguf"
    folder.mkdir(parents=True, exist_ok=True)
    want = {t: folder / f"{t}.gguf" for t in LLAMA_CPP_TYPES}
    if all(p.is_file() for p in want.values()):
        return want
    src = checkpoint(shape, log)
    bf16 = folder / "bf16.gguf"
    if not bf16.is_file():
        log(f"writing {bf16}")
        write_gguf(src, shape_config(shape), bf16)
    for kind, path in want.items():
        if path.is_file():
            continue
        log(f"llama-quantize {bf16.name} -> {path.name}")
        with replacing(path) as tmp:
            try:
                r = subprocess.run([quantize, str(bf16), str(tmp), kind, str(threads)], capture_output=True,
                                   text=True)
            except OSError as e:
                return {"error": f"{quantize}: {e}; build llama.cpp (../shared/peers/llama_cpp.sh build)"}
            if r.returncode != 0 or not tmp.is_file():
                tmp.unlink(missing_ok=True)  # a failed run's output is not kept
                return {"error": f"{quantize} {kind} failed (rc={r.returncode}): "
                                 f"{(r.stderr or r.stdout).strip()[-300:]}"}
    bf16.unlink()  # 16 GB at 8B: only the quantized files are benched
    return want


# --- engines ---------------------------------------------------------------------------------------------


def random_engine(shape: str, quant: str, device: str | None, kv_cache: str = "auto", native: bool = True,
                  log: Callable[[str], None] = lambda s: None):
    """An engine over the random checkpoint of a named shape, loaded as any model folder is, with the embedded
    model's tokenizer (its ids fit every shape's vocabulary). `awq` is the round-to-nearest INT4 folder."""
    from ..engine.engine import Engine, default_device
    from ..models.device_prep import prepare_for_device
    from ..models.loading import load_model
    from ..models.resolve import ModelFiles, resolve
    from ..models.tokenizer import load_tokenizer
    from ..models.weights_dtype import weights_dtype

    dev = torch.device(device) if device else default_device()
    tokenizer = load_tokenizer(resolve(None))
    folder = int4_folder(shape, log=log) if quant == "awq" else checkpoint(shape, log)
    files = ModelFiles(ref=str(folder), kind="dir", path=folder)
    int4_dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32  # the embedding's and the norms'
    dtype = int4_dtype if quant == "awq" else weights_dtype(shape_config(shape), dev, str(folder), files)
    model = load_model(files, dtype=dtype, device=dev, int4_on_use=native)
    step = prepare_for_device(model, native=native)
    return Engine(model, tokenizer, name=f"random-{shape}", quantization="rtn-int4" if quant == "awq" else "none",
                  context_window=4096, kv_cache=kv_cache, native=step)
