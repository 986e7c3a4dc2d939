"""A `tokenizers.Tokenizer` rebuilt from the vocabulary and merges a GGUF file stores as metadata.

A GGUF carries no tokenizer.json, only llama.cpp's description of one: the tokens, the merges, each
token's type, and the name of the pre-tokenizer (`tokenizer.ggml.pre`). We build the same BPE that
transformers builds from these (so the two agree token for token), splitting text with the regex that
name stands for in llama.cpp.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from .errors import ModelLoadError
from .families import by_gguf_arch

# llama.cpp token types
_CONTROL, _USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> the split regex its merges were learned with; names not here use GPT-2's.
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "megrez": _QWEN2_SPLIT,
}


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte, the alphabet byte-level BPE vocabularies are written in."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    spelled, extra = {}, 0
    for b in range(256):
        if b in keep:
            spelled[b] = chr(b)
        else:
            spelled[b] = chr(256 + extra)
            extra += 1
    return spelled


def build(meta: dict[str, Any], path: Path | str = "GGUF") -> Tokenizer:
    """The tokenizer `meta` (the GGUF's metadata) describes: byte-level BPE ("gpt2") or sentencepiece BPE ("llama")."""
    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
    if not tokens:
        raise ModelLoadError(f"{path}: the GGUF has no tokenizer vocabulary; use a GGUF converted with its tokenizer")
    family = by_gguf_arch(meta.get("general.architecture"))
    if kind == "gpt2":
        tok = _byte_level(tokens, meta)
    elif kind == "llama" and family is not None and family.gemma_vocab:
        tok = _gemma_sentencepiece(tokens)
    elif kind == "llama":
        tok = _sentencepiece_bpe(tokens, meta)
    else:
        raise ModelLoadError(
            f"{path}: GGUF tokenizer type {kind!r} is not supported (gpt2 and llama are); "
            "use a model directory with tokenizer.json instead"
        )
    types = meta.get("tokenizer.ggml.token_type") or [0] * len(tokens)
    alphabet = set(_byte_alphabet().values())
    control = [
        AddedToken(t, normalized=False, special=True)
        for t, ty in zip(tokens, types, strict=False)
        # in a byte-level vocabulary a "control" token outside the alphabet is a converter mislabel
        if ty == _CONTROL and (kind != "gpt2" or set(t) <= alphabet)
    ]
    tok.add_special_tokens(control)
    vocab = tok.get_vocab()
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, ty in zip(tokens, types, strict=False) if ty == _USER_DEFINED and t in vocab])
    return tok


def _merges(meta: dict[str, Any], vocab: dict[str, int], scores: list[float] | None,
            order: list[str] | None = None) -> list[tuple[str, str]]:
    if meta.get("tokenizer.ggml.merges"):
        return [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]  # type: ignore[misc]
    # Older sentencepiece GGUFs store scores instead of merges: every split of a token into two known
    # tokens is a merge, ranked by the merged token's score (as transformers' generate_merges does).
    # `order`: the tokens those scores belong to, when not the vocabulary's own order.
    ranked = []
    for token, score in zip(order or vocab, scores or [0.0] * len(vocab), strict=False):
        local = [(token[:i], token[i:], score) for i in range(1, len(token))
                 if token[:i] in vocab and token[i:] in vocab]
        ranked += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    ranked.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=scores is not None)
    return [(a, b) for a, b, _ in ranked]


def _byte_level(tokens: list[str], meta: dict[str, Any]) -> Tokenizer:
    spell = _byte_alphabet()
    alphabet = set(spell.values())
    vocab = {t if set(t) <= alphabet else "".join(spell[b] for b in t.encode()): i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_merges(meta, vocab, None)))
    split = PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre", ""))
    if split is not None:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    elif meta.get("tokenizer.ggml.pre") == "smollm":  # llama.cpp: each digit alone, then GPT-2's regex
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(tokens: list[str], meta: dict[str, Any]) -> Tokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    scores = meta.get("tokenizer.ggml.scores")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_merges(meta, vocab, scores), fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(content=" ", left=1),
    ])
    return tok


def _gemma_sentencepiece(tokens: list[str]) -> Tokenizer:
    """Gemma's sentencepiece BPE as transformers builds it from a GGUF (spaces as "▁", no prefix space).

    Two quirks of Gemma files: runs of spaces are stored as real spaces (respelled "▁", as transformers does;
    this file also marks them user-defined, so they match whole either way), and the merge order is the
    order of the tokens in the file, not their scores.
    """
    tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    positions = {t: -i for i, t in enumerate(tokens)}
    merges = _merges({}, vocab, list(positions.values()), order=list(positions))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok
