"""A `FakeEngine` that `parley serve` can host: it adds the tokenizer the request layer uses (one token per
UTF-8 byte) and counts how often a prompt was tokenized."""

from __future__ import annotations

from fake_engine import FakeEngine


class ByteCountingTokenizer:
    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str) -> list[int]:
        self.calls += 1
        return list(text.encode("utf-8"))

    def render_chat(self, messages, add_generation_prompt: bool = True, cancel=None) -> str:
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + ("<assistant>" if add_generation_prompt
                                                                              else "")

    def encode_chat(self, messages, add_generation_prompt: bool = True, cancel=None) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))


def serve_engine(**kwargs) -> FakeEngine:
    engine = FakeEngine(**kwargs)
    engine.tokenizer = ByteCountingTokenizer()
    return engine
