"""Test doubles: a tiny random model and a byte-level tokenizer, for engine tests that need no files."""

from __future__ import annotations

import torch

from parley.engine.engine import Engine
from parley.models.config import ModelConfig
from parley.models.transformer import Transformer

EOS, USER, ASSISTANT = 256, 257, 258


class ByteStream:
    def push(self, token: int) -> str:
        return chr(token) if token < 256 else ""

    def flush(self) -> str:
        return ""


class ByteTokenizer:
    """Latin-1 characters are tokens (so any output round-trips); three specials frame a chat."""

    vocab_size = 259
    stop_ids = frozenset({EOS})
    eos_id = EOS

    def encode(self, text: str) -> list[int]:
        return list(text.encode("latin-1", errors="replace"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("latin-1")

    def encode_chat(self, messages: list[dict[str, str]], cancel=None) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += [ASSISTANT if m["role"] == "assistant" else USER, *self.encode(m["content"]), EOS]
        return ids + [ASSISTANT]

    def stream(self) -> ByteStream:
        return ByteStream()


def tiny_model(seed: int = 0, vocab: int = 259, layers: int = 2, max_len: int = 512) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(arch="llama", vocab_size=vocab, dim=64, n_layers=layers, n_heads=4, n_kv_heads=2,
                      intermediate_size=128, max_seq_len=max_len, tie_embeddings=False)
    model = Transformer(cfg)
    with torch.no_grad():  # logits of a few units, so greedy and sampled text differ and vary
        model.lm_head.weight.normal_(0, 0.3)
        model.lm_head.weight[256:] = 0.0  # specials are rarely predicted
    return model.eval()


def tiny_engine(seed: int = 0, **kw) -> Engine:
    return Engine(tiny_model(seed), ByteTokenizer(), name="tiny", **kw)
