"""On the embedded SmolLM2 GGUF, our tokenizer and chat template equal transformers' GGUF tokenizer."""

import pytest

from parley.models.resolve import embedded_model_path, resolve
from parley.models.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

STRINGS = [
    "Hello, world!",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # recursion\n\n\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "😀 👍🏽 🇫🇷 👨‍👩‍👧 emoji",
    "日本語のテキスト、中文句子。한국어 문장",
    "3.14159 1234567890 x=1000000 -42 1e-5 0x1F",
    "   leading, and trailing   ",
    "tabs\t\tand\r\nCRLF\n\n\n\nruns          of spaces",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "don't I'll we've THEY'RE",
    "naïve café Ünïcödé straße Ωμέγα",
    "",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi 👋"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "日本?"}],
]


@pytest.fixture(scope="module")
def tokenizers():
    path = embedded_model_path()
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return load_tokenizer(resolve(str(path))), ref


@pytest.mark.parametrize("text", STRINGS)
def test_encode_decode_match(tokenizers, text):
    ours, ref = tokenizers
    ids = ours.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == ref.decode(ids) == text
    assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("n", range(len(CONVERSATIONS)))
def test_chat_template_matches(tokenizers, n, add_generation_prompt):
    ours, ref = tokenizers
    messages = CONVERSATIONS[n]
    want = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.render_chat(messages, add_generation_prompt) == want
    want_ids = ref.apply_chat_template(messages, tokenize=True, return_dict=True,
                                       add_generation_prompt=add_generation_prompt)["input_ids"]
    assert ours.encode_chat(messages, add_generation_prompt) == list(want_ids)


def test_vocab_and_stop_tokens(tokenizers):
    ours, ref = tokenizers
    assert ours.vocab() == ref.get_vocab()
    assert ours.vocab_size == len(ref) == 49152
    assert ours.eos_id == ref.eos_token_id == ours.vocab()["<|im_end|>"]
    assert ours.stop_ids == {ours.vocab()["<|im_end|>"], ours.vocab()["<|endoftext|>"]}
