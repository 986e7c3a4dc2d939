"""Gemma 3's SentencePiece vocabulary, rebuilt from the GGUF's metadata (tokens, types; merges in file
order), tokenizes and decodes tricky text exactly as transformers does from the same file: built afresh
(cold) and read back from the Parley cache on the next launch (cached)."""

import pytest
from gemma_gguf import gemma_gguf

from parley.models import gguf_tokenizer, tokenizer_cache
from parley.models.resolve import resolve
from parley.models.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

TEXTS = [
    "Hello world", " leading space", "  two leading spaces", "trailing   ", "\tTab and\nnewline\n\n",
    "12345 67.89 in 2026, 1,000,000", "byte fallback: \x01\x7f\x1b", "emoji 😀👍🏽 and 🇫🇷",
    "中文字符和日本語のテキスト",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", "a\u00a0b\u200bc", "Ünïcödé façade",
    "x" * 40, "x        y", "def f(x):\n    return x**2  # square\n", "<bos>text<eos>",
]


@pytest.fixture(scope="module")
def reference():
    path = gemma_gguf()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module", params=["cold", "cached"])
def tokenizers(request, reference, tmp_path_factory):
    path = gemma_gguf()
    with pytest.MonkeyPatch.context() as mp:  # module scope: set up before conftest's per-test cache dir
        mp.setenv("PARLEY_CACHE_DIR", str(tmp_path_factory.mktemp(f"cache-{request.param}")))
        cold = load_tokenizer(resolve(str(path)))
        assert tokenizer_cache.cache_path(path).is_file()
        if request.param == "cold":
            return cold, reference

        def rebuilt(*a, **k):
            raise AssertionError("the vocabulary was rebuilt although the cached tokenizer was intact")

        mp.setattr(gguf_tokenizer, "build", rebuilt)
        return load_tokenizer(resolve(str(path))), reference


@pytest.mark.parametrize("text", TEXTS)
def test_encode_and_decode_match(tokenizers, text):
    ours, ref = tokenizers
    ids = ours.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False), repr(text)
    assert ours.decode(ids) == ref.decode(ids), repr(text)


def test_turn_markers_are_single_special_tokens(tokenizers):
    ours, _ = tokenizers
    ids = ours.encode("<start_of_turn>model\n")
    assert ids[0] == ours.vocab()["<start_of_turn>"] and ours.vocab()["<end_of_turn>"] in ours.stop_ids
    assert ours.encode_raw("Hi")[0] == ours.bos_id == ours.vocab()["<bos>"]
