"""Weights onto a Transformer, from every source Parley reads: safetensors (one file or shards), GGUF
(dequantized) and AWQ folders (INT4 linears). Nothing else: never pickle.

One assembler serves all three. Checkpoint names map onto ours by dropping `model.`; every tensor is
checked against the shape the config implies before anything is allocated, so a wrong or damaged file
fails here, by name, and not as garbage text later. Rotary frequencies come from the config, divided by
GGUF's `rope_freqs` (llama3-style scaling) when the file has them; an AWQ folder written from such a
model stores the resulting frequencies as `model.rotary_emb.inv_freq`, which transformers and vLLM skip.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from .config import ModelConfig
from .errors import ModelLoadError
from .progress import Progress, ProgressFn
from .resolve import ModelFiles, weight_files
from .transformer import Transformer, is_norm_weight, rope_frequencies

if TYPE_CHECKING:
    from .gguf_int4 import Imported
    from .quantize.int4_linear import Q4Rows, RowsReader

INV_FREQ = "rotary_emb.inv_freq"  # our name (after `model.`) for stored rotary frequencies


def load_config(files: ModelFiles) -> ModelConfig:
    """The model's config, from config.json or the GGUF metadata (a ModelLoadError naming the field)."""
    if files.kind == "gguf":
        from .gguf_weights import open_gguf

        return ModelConfig.from_gguf(open_gguf(files.path))
    return ModelConfig.from_json(files.path / "config.json")


def load_model(files: ModelFiles, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu", progress: ProgressFn | None = None,
               name: str | None = None, gguf_int4: Imported | None = None, int4_on_use: bool = False) -> Transformer:
    """The model in eval mode, its weights in `dtype` on `device` (INT4 scales stay fp16). `progress` hears
    once the config is valid (a damaged config is one error line, with no progress line before it).
    `gguf_int4` (GGUF only): the decoder's linears as INT4 from the file's own 4-bit blocks, not dequantized
    (models/gguf_int4.py); what was imported how is tallied in it.
    `int4_on_use` (an AWQ folder on the CPU): each INT4 linear's tensors are read from the checkpoint when first
    used, not at load (`Int4Linear.read_on_use`): the native step, which runs a packed copy of its own, then
    never holds them twice. The embedding then stays as stored (fp16 or bf16, widened exactly row by row where
    it is looked up: `Transformer.embed`, the native step), not doubled into fp32."""
    from .quantize.checkpoint import awq_group_size_of, is_awq

    def reading() -> None:
        if progress is not None:
            progress(Progress("load", 0, 0, "", f"reading the weights of {name or Path(files.path).name}"))

    if files.kind == "gguf":
        from .gguf_weights import Int4Reader, MatrixReader, iter_weights, open_gguf

        file = open_gguf(files.path)
        config = ModelConfig.from_gguf(file)
        reading()
        readers: dict[str, Callable[[], dict[str, torch.Tensor]]] | None = None
        if int4_on_use and gguf_int4 is not None and torch.device(device).type == "cpu" and dtype == torch.float32:
            readers = {}  # the decoder's INT4 tensors, an untied head and the table, decoded from the file on use
        weights = iter_weights(file, config.arch, config.n_heads, config.n_kv_heads, gguf_int4, readers)
        from .gguf_int4 import GROUP

        model = assemble(config, weights, dtype, device, str(files.path), GROUP if gguf_int4 is not None else None)
        if readers:
            source = str(files.path)
            _attach_readers(model, {name: _checked(name, read, source) for name, read in readers.items()},
                            {name: _checked_rows(name, read.rows, source) for name, read in readers.items()
                             if isinstance(read, Int4Reader)},
                            {name: _checked_block(f"{name}.weight", read.row_block, source)
                             for name, read in readers.items() if isinstance(read, MatrixReader)},
                            _checked_block("embed_tokens.weight", table.lookup, source)
                            if isinstance(table := readers.get("embed_tokens"), MatrixReader) else None)
        if gguf_int4 is not None and not gguf_int4.own:
            raise ModelLoadError(f"{files.path}: no decoder weight is stored 4-bit (Q4_0, Q4_1 or Q4_K) but "
                                 f"{gguf_int4.words().removeprefix('none + ')}; --quant gguf runs a file's own 4-bit "
                                 "weights -- use --quant awq (Parley's INT4) or none")
        return model
    if gguf_int4 is not None:
        raise ModelLoadError(f"{files.path}: --quant gguf imports a .gguf file's own 4-bit weights; this is not "
                             "a .gguf file -- use --quant awq or none")
    config = load_config(files)
    group_size = None
    if is_awq(config.quantization):
        group_size = awq_group_size_of(config.quantization, str(files.path / "config.json"))
    elif config.quantization:
        method = config.quantization.get("quant_method")
        raise ModelLoadError(
            f"{files.path / 'config.json'}: quantization {method!r} is not supported; use the unquantized "
            "model (Parley quantizes it to AWQ itself) or an AWQ checkpoint"
        )
    reading()
    lazy = int4_on_use and group_size is not None and torch.device(device).type == "cpu"
    sources: dict[str, tuple[Path, str]] = {}
    weights = safetensors_weights(files.path, device, sources if lazy else None)
    if config.norm_unit_offset:  # Gemma stores w for a gain of 1 + w; the model holds the gain
        weights = ((n, t.float() + 1 if is_norm_weight(n) else t) for n, t in weights)
    model = assemble(config, weights, dtype, device, str(files.path), group_size, check_values=not files.verified,
                     narrow_embedding=lazy)
    if sources:
        _read_on_use(model, sources, str(files.path), dtype, check_values=not files.verified)
    if group_size is not None:  # Parley's own quantization keeps a rotated down_proj beside the standard one
        from .quantize import hadamard

        hadamard.apply(model, Path(files.path), on_use=lazy)
    return model


_INT4_STORED = (".qweight", ".qzeros", ".scales", ".mins")
_SAFETENSORS_DTYPES = {"I32": torch.int32, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
                       "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I64": torch.int64}


def safetensors_weights(path: Path, device: torch.device | str = "cpu",
                        on_use: dict[str, tuple[Path, str]] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(our name, tensor) for every tensor of every shard, read straight onto `device`. `on_use` given: INT4
    linears' tensors and an untied output head are not read but yielded on the meta device (their stored shape
    and dtype), and where to read each is put in `on_use` by name."""
    for name in weight_files(path):
        file = path / name
        try:
            with safe_open(file, framework="pt", device=str(device)) as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    ours = key.removeprefix("model.")
                    if on_use is not None and (ours.endswith(_INT4_STORED) or ours == "lm_head.weight"):
                        stored = f.get_slice(key)
                        dtype = _SAFETENSORS_DTYPES.get(stored.get_dtype())
                        if dtype is not None:
                            on_use[ours] = (file, key)
                            yield ours, torch.empty(stored.get_shape(), dtype=dtype, device="meta")
                            continue
                    yield ours, f.get_tensor(key)
        except FileNotFoundError:
            raise ModelLoadError(f"{file}: missing; re-download the model") from None
        except Exception as e:  # SafetensorError: truncated header or data, bad JSON, wrong offsets
            if isinstance(e, ModelLoadError):
                raise
            raise ModelLoadError(
                f"{file}: not a valid safetensors file ({e}); it is probably truncated or corrupted -- "
                "delete it and download the model again"
            ) from None


@contextmanager
def _no_random_init() -> Iterator[None]:
    """Skip the modules' random init while this thread builds a model on the meta device: every weight is
    replaced by the checkpoint's, and the meta kernels of `normal_`/`uniform_` import torch._dynamo on first
    use (1.4 s of a cached start). Other threads keep the real init functions."""
    me, names = threading.get_ident(), ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_")
    saved = {name: getattr(torch.nn.init, name) for name in names}

    def skipping(original):
        def init(tensor, *args, **kwargs):
            return tensor if threading.get_ident() == me else original(tensor, *args, **kwargs)
        return init

    for name, original in saved.items():
        setattr(torch.nn.init, name, skipping(original))
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(torch.nn.init, name, original)


@torch.no_grad()
def assemble(config: ModelConfig, weights: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype,
             device: torch.device | str, source: str, group_size: int | None = None,
             check_values: bool = True, narrow_embedding: bool = False) -> Transformer:
    """Build the model on the meta device (nothing allocated), then place each checkpoint tensor into it.

    `group_size` set: an AWQ checkpoint. Each decoder linear whose `qweight` the checkpoint holds becomes
    an Int4Linear; linears stored unquantized (`modules_to_not_convert`) stay nn.Linear. `check_values=False`
    (a cache folder that matched its manifest): dtypes are still checked, the scan for NaN and infinities is not.
    `narrow_embedding`: an embedding stored in fp16 or bf16 keeps that dtype under an fp32 `dtype`.
    """
    try:
        with torch.device("meta"), _no_random_init():
            model = Transformer(config)
    except ValueError as e:  # e.g. a rope scaling the model does not implement
        raise ModelLoadError(f"{source}: {e}; use a model of a supported configuration") from None
    expected = _shapes(model, config)
    linears = _decoder_linears(model) if group_size is not None else {}
    n_linears = len(linears)
    placed: dict[str, torch.Tensor] = {}
    rope_freqs = inv_freq = None
    for name, tensor in weights:
        if name == "rope_freqs":
            rope_freqs = tensor
            continue
        if name == INV_FREQ:
            inv_freq = tensor
            continue
        if name.endswith(INV_FREQ) or (name == "lm_head.weight" and config.tie_embeddings):
            continue  # recomputed, or the same tensor as embed_tokens
        prefix = name.rpartition(".")[0]
        if name.endswith((".qweight", ".qzeros", ".scales", ".mins")) and prefix in linears:  # any may come first
            # but `mins` (a GGUF import's float minimum per group) comes first where a linear has them
            int4 = _swap_in_int4(*linears.pop(prefix), prefix, group_size, dtype, source, name.endswith(".mins"))
            expected.pop(f"{prefix}.weight")
            expected.pop(f"{prefix}.bias", None)
            expected.update({f"{prefix}.{k}": t.shape for k, t in int4.state_dict().items()})
        if name not in expected:
            raise ModelLoadError(
                f"{source}: unexpected tensor {name!r} for a {config.arch} model; the weights do not match "
                "the config (a different architecture?) -- use the model's own config.json or re-download it"
            )
        if tuple(tensor.shape) != tuple(expected[name]):
            raise ModelLoadError(
                f"{source}: tensor {name} has shape {tuple(tensor.shape)}, the config implies "
                f"{tuple(expected[name])}; the weights and the config disagree, re-download the model"
            )
        _check_values(name, tensor, source, check_values)
        narrow = (narrow_embedding and name == "embed_tokens.weight" and dtype == torch.float32
                  and tensor.dtype in (torch.float16, torch.bfloat16))
        if tensor.is_floating_point() and not narrow:  # INT4 scales stay fp16, as the kernels read them
            tensor = tensor.to(torch.float16 if name.endswith((".scales", ".mins")) else dtype)
        placed[name] = tensor if tensor.is_meta else tensor.to(device)  # meta: read on use
    if n_linears and len(linears) == n_linears:  # not one qweight: a full-precision model under an AWQ label
        raise ModelLoadError(f"{source}: config.json says AWQ (quantization_config) but the weights hold no "
                             "qweight; re-download the AWQ checkpoint, or delete quantization_config to load "
                             "them as full precision")
    missing = sorted(set(expected) - set(placed))
    if missing:
        raise ModelLoadError(
            f"{source}: {len(missing)} tensor(s) missing, e.g. {', '.join(missing[:3])}; "
            "the checkpoint is incomplete, re-download it"
        )
    model.load_state_dict(placed, strict=False, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.inv_freq = _rotary_frequencies(config, rope_freqs, inv_freq, source).to(device)
    if config.local_rope:  # Gemma 3's sliding-window layers: their own base, never scaled
        model.inv_freq_local = rope_frequencies(config, local=True).to(device)
    return model.eval()


def _checked(prefix: str, read: Callable[[], dict[str, torch.Tensor]], source: str
             ) -> Callable[[], dict[str, torch.Tensor]]:
    """`read`, its tensors checked as `assemble` checks what it places."""
    def read_checked() -> dict[str, torch.Tensor]:
        tensors = read()
        for part, tensor in tensors.items():
            _check_values(f"{prefix}.{part}", tensor, source, True)
        return tensors
    return read_checked


def _checked_rows(prefix: str, rows: RowsReader, source: str) -> RowsReader:
    """`rows` (`Int4Linear.q4_rows`'s form), its scales and minimums checked as `assemble` checks them."""
    def rows_checked() -> Q4Rows:
        q, zeros, scales, mins = rows()
        _check_values(f"{prefix}.scales", scales, source, True)
        if mins is not None:
            _check_values(f"{prefix}.mins", mins, source, True)
        return q, zeros, scales, mins
    return rows_checked


def _checked_block(name: str, read: Callable[..., torch.Tensor], source: str) -> Callable[..., torch.Tensor]:
    """`read` (some rows of a weight: r0..r1, or those of some token ids), each block checked as `assemble`
    checks a whole weight."""
    def block_checked(*rows: Any) -> torch.Tensor:
        block = read(*rows)
        _check_values(name, block, source, True)
        return block
    return block_checked


def _attach_readers(model: Transformer, readers: dict[str, Callable[[], dict[str, torch.Tensor]]],
                    rows: dict[str, RowsReader] | None = None,
                    blocks: dict[str, Callable[[int, int], torch.Tensor]] | None = None,
                    lookup: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
    """Give each INT4 linear left on the meta device, an untied head and an embedding left there (a GGUF's) its
    reader (`readers`, by module name; models/read_on_use.py); a linear its reader of row-major integers where
    `rows` has one, the head and the embedding their readers of row blocks (`blocks`) where the checkpoint has
    them, and the embedding its reader of looked-up rows (`lookup`). A tied head left on the meta device reads the
    table, as the table does."""
    from .quantize.int4_linear import Int4Linear
    from .read_on_use import EmbeddingOnUse, HeadOnUse

    blocks = blocks or {}
    for prefix, module in model.named_modules():
        if isinstance(module, Int4Linear) and prefix in readers:
            module.read_on_use(readers[prefix], (rows or {}).get(prefix))
    if "embed_tokens" in readers:
        held = model.embed_tokens.weight
        table = EmbeddingOnUse(held.shape[0], held.shape[1], device="meta", dtype=held.dtype)
        table.read_on_use(readers["embed_tokens"], blocks.get("embed_tokens"), lookup)
        model.embed_tokens = table
    head_of = "embed_tokens" if model.config.tie_embeddings else "lm_head"  # a tied file's own copy is skipped
    if head_of in readers:
        held = model.lm_head.weight
        head = HeadOnUse(held.shape[1], held.shape[0], bias=False, device="meta", dtype=held.dtype)
        head.read_on_use(readers[head_of], blocks.get(head_of))
        model.lm_head = head


def _read_on_use(model: Transformer, sources: dict[str, tuple[Path, str]], source: str, dtype: torch.dtype,
                 check_values: bool) -> None:
    """Give each INT4 linear left on the meta device, and an untied head, a reader of its tensors
    (models/read_on_use.py), which converts and checks them as `assemble` does what it reads."""
    from .quantize.int4_linear import Int4Linear
    from .read_on_use import HeadOnUse

    def reader(prefix: str, parts: tuple[str, ...]) -> Callable[[], dict[str, torch.Tensor]]:
        def read() -> dict[str, torch.Tensor]:
            out = {}
            for part in parts:
                name = f"{prefix}.{part}"
                if name not in sources:
                    continue
                file, key = sources[name]
                try:
                    with safe_open(file, framework="pt") as f:
                        tensor = f.get_tensor(key)
                except Exception as e:  # the file was replaced or damaged since the load
                    raise ModelLoadError(f"{file}: {key} no longer reads ({e}); delete the folder and load the "
                                         "model again") from None
                _check_values(name, tensor, source, check_values)
                if tensor.is_floating_point():
                    tensor = tensor.to(torch.float16 if part in ("scales", "mins") else dtype)
                out[part] = tensor
            return out
        return read

    readers = {prefix: reader(prefix, Int4Linear.ON_USE) for prefix, module in model.named_modules()
               if isinstance(module, Int4Linear) and f"{prefix}.qweight" in sources}
    if "lm_head.weight" in sources:
        readers["lm_head"] = reader("lm_head", HeadOnUse.ON_USE)
    _attach_readers(model, readers)


def _check_values(name: str, tensor: torch.Tensor, source: str, finite: bool = True) -> None:
    """Packed INT4 tensors are int32, everything else floating point and finite: a damaged file fails here,
    by name, not as NaN logits ("the model produced no text") later."""
    packed = name.endswith((".qweight", ".qzeros"))
    if packed != (tensor.dtype == torch.int32) or (not packed and not tensor.is_floating_point()):
        expected = "int32 (packed INT4)" if packed else "floating point"
        raise ModelLoadError(f"{source}: tensor {name} is stored as {str(tensor.dtype).removeprefix('torch.')}, "
                             f"expected {expected}; the file is damaged or not this model's, re-download it")
    if finite and not packed and not tensor.is_meta and not _all_finite(tensor):
        raise ModelLoadError(f"{source}: tensor {name} holds NaN or infinite values; the file is damaged, "
                             "re-download the model")


def _all_finite(tensor: torch.Tensor, block: int = 1 << 22) -> bool:
    """torch.isfinite a block of elements at a time: over a whole tensor its temporaries take ~6 bytes an
    element (1.7 GB beside a 1B model's fp32 embedding)."""
    flat = tensor.reshape(-1)
    return all(bool(torch.isfinite(flat[i : i + block]).all()) for i in range(0, flat.numel(), block))


def _shapes(model: Transformer, config: ModelConfig) -> dict[str, torch.Size]:
    shapes = {name: t.shape for name, t in model.state_dict().items()}
    if config.tie_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def _decoder_linears(model: Transformer) -> dict[str, tuple[torch.nn.Module, str, torch.nn.Module]]:
    """Our name of each decoder projection -> (parent, attribute, module), the places an INT4 linear can go."""
    from .quantize.int4_linear import decoder_linears

    names = {m: k for k, m in model.named_modules()}
    return {names[lin]: (parent, attr, lin) for parent, attr, lin in decoder_linears(model)}


def _swap_in_int4(parent: torch.nn.Module, attr: str, lin: torch.nn.Module, name: str, group_size: int,
                  dtype: torch.dtype, source: str, mins: bool = False) -> torch.nn.Module:
    from .quantize.int4_linear import Int4Linear

    try:
        int4 = Int4Linear(lin.in_features, lin.out_features, group_size, lin.bias is not None,
                          device="meta", dtype=dtype, mins=mins)
    except ValueError as e:
        raise ModelLoadError(f"{source}: {name}: {e}; the AWQ checkpoint's group_size does not fit this "
                             "model -- re-quantize it") from None
    setattr(parent, attr, int4)
    return int4


def _rotary_frequencies(config: ModelConfig, rope_freqs: torch.Tensor | None, stored: torch.Tensor | None,
                        source: str) -> torch.Tensor:
    half = config.head_dim // 2
    for name, t in (("rope_freqs", rope_freqs), (f"model.{INV_FREQ}", stored)):
        if t is not None and tuple(t.shape) != (half,):
            raise ModelLoadError(f"{source}: tensor {name} has shape {tuple(t.shape)}, the config implies "
                                 f"({half},); the file is damaged, re-download it")
    if stored is not None:
        return stored.float()
    try:
        inv_freq = rope_frequencies(config)
    except (ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{source}: rope_scaling: {e}; use a model with a supported rope scaling") from None
    if rope_freqs is not None:  # llama.cpp stores llama3-style scaling as divisors of each frequency
        inv_freq = inv_freq / rope_freqs.float()
    return inv_freq
