"""On the real Gemma 3 270M GGUF (Q4_K/Q5_0/Q6_K/Q8_0 tensors, 262k vocabulary), our fp model continues
raw prompts greedily exactly as transformers does when it loads the same file, for at least 32 tokens."""

import pytest
import torch
from gemma_gguf import gemma_gguf

from parley.models.loading import load_model
from parley.models.resolve import resolve
from parley.models.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers needs it to load a GGUF
pytestmark = pytest.mark.slow

PROMPTS = [
    "The history of the Roman Empire",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n",
    "Les fleurs du jardin",
]
NEW_TOKENS = 36


@pytest.fixture(scope="module")
def models():
    path = gemma_gguf()
    files = resolve(str(path))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                            dtype=torch.float32).eval()
    return load_model(files), load_tokenizer(files), ref


@pytest.mark.parametrize("prompt", PROMPTS)
@torch.no_grad()
def test_greedy_continuation_matches(models, prompt):
    """Our greedy continuation (prefill, then cached one-token steps) checked against transformers' argmax
    after every prefix of it, in one reference pass."""
    ours, tok, ref = models
    ids = tok.encode_raw(prompt)
    assert ids[0] == tok.bos_id, "Gemma wants <bos> first"
    cache = ours.new_cache(len(ids) + NEW_TOKENS)
    logits = ours(torch.tensor([ids]), torch.arange(len(ids))[None], cache)
    got: list[int] = []
    while len(got) < NEW_TOKENS:
        got.append(int(logits[0, -1].argmax()))
        t = len(ids) + len(got) - 1
        logits = ours(torch.tensor([[got[-1]]]), torch.tensor([[t]]), cache)
    want = ref(torch.tensor([ids + got])).logits[0, len(ids) - 1 : -1].argmax(-1).tolist()
    assert got == want, (tok.decode(got), tok.decode(want))
