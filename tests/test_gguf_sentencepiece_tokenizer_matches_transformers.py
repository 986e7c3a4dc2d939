"""A GGUF with a sentencepiece ("llama") vocabulary and no merges (merges rebuilt from scores) tokenizes as
transformers' GGUF tokenizer does."""

import gguf
import pytest

from parley.models.resolve import resolve
from parley.models.tokenizer import load_tokenizer

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello world, hello there!",
          "A tokenizer splits text into pieces."] * 50
STRINGS = ["Hello world", " Hello  world ", "日本 fox 😀", "<s>user\nHello</s>\n", "tab\there\n\nnew", ""]


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("spgguf")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_prefix=str(d / "sp"), vocab_size=340, model_type="bpe",
        byte_fallback=True, bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2,
        normalization_rule_name="identity", remove_extra_whitespaces=False)
    sp = spm.SentencePieceProcessor(model_file=str(d / "sp.model"))
    (d / "sp.model").unlink()  # transformers would pick it up instead of the GGUF
    n = sp.get_piece_size()
    w = gguf.GGUFWriter(str(d / "sp.gguf"), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types([2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1
                       for i in range(n)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return d / "sp.gguf"


@pytest.mark.parametrize("text", STRINGS)
def test_matches_transformers(gguf_path, text):
    ours = load_tokenizer(resolve(str(gguf_path)))
    ref = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    ids = ours.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == ref.decode(ids) == text.removeprefix(" ")  # sentencepiece drops one leading space
    assert ours.eos_id == 2 and 2 in ours.stop_ids
