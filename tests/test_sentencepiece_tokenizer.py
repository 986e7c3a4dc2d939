"""A model directory with only tokenizer.model (sentencepiece): added tokens from tokenizer_config are matched
whole, plain text is sentencepiece's own encoding, and streaming over byte-fallback pieces stays whole."""

import json

import pytest

from parley.models.resolve import ModelFiles
from parley.models.tokenizer import load_tokenizer

spm = pytest.importorskip("sentencepiece")

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello world, hello there!",
          "A tokenizer splits text into pieces."] * 50


@pytest.fixture(scope="module")
def sp_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("sp")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_prefix=str(d / "tokenizer"), vocab_size=340, model_type="bpe",
        byte_fallback=True, bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2,
        normalization_rule_name="identity", remove_extra_whitespaces=False)  # as llama's tokenizer.model
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>",
        "added_tokens_decoder": {"340": {"content": "<|im_start|>", "special": True},
                                 "341": {"content": "<|im_end|>", "special": True}},
        "chat_template": "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                         "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    }))
    return d


@pytest.fixture(scope="module")
def tok(sp_dir):
    return load_tokenizer(ModelFiles(ref="sp", kind="dir", path=sp_dir))


def test_plain_text_is_sentencepiece_encoding(tok, sp_dir):
    sp = spm.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
    for text in ["Hello world", "The quick brown fox", "日本 fox 😀", "tab\there"]:
        assert tok.encode(text) == sp.encode(text)
        assert tok.decode(tok.encode(text)) == text


def test_added_tokens_are_matched_whole(tok):
    ids = tok.encode("<|im_start|>user\nHello<|im_end|>")
    assert ids[0] == 340 and ids[-1] == 341
    assert tok.decode(ids) == "<|im_start|>user\nHello<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHello"


def test_chat_template_and_stop_ids(tok):
    text = tok.render_chat([{"role": "user", "content": "Hi"}])
    assert text == "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode_chat([{"role": "user", "content": "Hi"}])[:2] == [1, 340]
    assert tok.eos_id == 2 and tok.stop_ids == {2, 341}


def test_stream_over_byte_fallback(tok):
    text = "Hello 日本語 😀 world"
    ids = tok.encode(text)
    stream = tok.stream()
    deltas = [stream.push(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas) and any(d == "" for d in deltas)
    assert "".join(deltas) + stream.flush() == text
