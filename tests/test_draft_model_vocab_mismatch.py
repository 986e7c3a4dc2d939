"""A draft model whose tokenizer differs from the target's is refused at construction, by a message
that names both vocabularies."""

import pytest
from tiny import ByteTokenizer, tiny_model

from parley.engine.speculative import DraftModel, VocabularyMismatch


class BiggerTokenizer(ByteTokenizer):
    vocab_size = 300


class VocabTokenizer(ByteTokenizer):
    def __init__(self, swap: bool = False) -> None:
        self._vocab = {chr(i): i for i in range(256)} | {"<eos>": 256, "<user>": 257, "<assistant>": 258}
        if swap:
            self._vocab["a"], self._vocab["b"] = self._vocab["b"], self._vocab["a"]

    def vocab(self) -> dict[str, int]:
        return dict(self._vocab)


def test_different_vocab_sizes_are_named():
    with pytest.raises(VocabularyMismatch, match=r"300 tokens.*259") as err:
        DraftModel(tiny_model(vocab=300), BiggerTokenizer(), ByteTokenizer())
    assert "same model family" in str(err.value)


def test_same_size_but_different_ids_is_refused():
    with pytest.raises(VocabularyMismatch, match=r"259 entries.*259 entries.*'a': draft 98 / target 97"):
        DraftModel(tiny_model(), VocabTokenizer(swap=True), VocabTokenizer())


def test_matching_tokenizers_are_accepted():
    DraftModel(tiny_model(seed=1), VocabTokenizer(), VocabTokenizer())
