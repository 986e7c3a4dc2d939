"""On the embedded SmolLM2 GGUF, our loaded model continues chat prompts greedily exactly as transformers
does when it loads the same file (dequantized, q/k un-permuted), for at least 32 tokens."""

import pytest
import torch

from parley.models.loading import load_model
from parley.models.resolve import embedded_model_path, resolve
from parley.models.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers needs it to load a GGUF
pytestmark = pytest.mark.slow

PROMPTS = [  # questions with long answers, so that no reply ends before NEW_TOKENS
    "Write a short poem about the sea.",
    "Explain in a few sentences how a bicycle works.",
    "List five fruits and describe each one briefly.",
]
NEW_TOKENS = 36


@pytest.fixture(scope="module")
def models():
    path = embedded_model_path()
    files = resolve(str(path))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                            dtype=torch.float32).eval()
    return load_model(files), load_tokenizer(files), ref


@torch.no_grad()
def greedy(model, prompt: list[int], n: int, stop: frozenset[int]) -> list[int]:
    """Prefill, then one token at a time through the KV cache, keeping cache.length ourselves."""
    cache = model.new_cache(len(prompt) + n)
    logits = model(torch.tensor([prompt]), torch.arange(len(prompt))[None], cache)
    cache.length = len(prompt)
    out: list[int] = []
    while len(out) < n:
        token = int(logits[0, -1].argmax())
        out.append(token)
        if token in stop:
            break
        logits = model(torch.tensor([[token]]), torch.tensor([[cache.length]]), cache)
        cache.length += 1
    return out


@torch.no_grad()
def test_logits_match_on_a_chat_prompt(models):
    ours, tok, ref = models
    ids = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    got = ours(torch.tensor([ids]), torch.arange(len(ids))[None], ours.new_cache(len(ids)))
    torch.testing.assert_close(got, ref(torch.tensor([ids])).logits, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("prompt", PROMPTS)
@torch.no_grad()
def test_greedy_continuation_matches(models, prompt):
    """Our greedy reply, checked against transformers' argmax after every prefix of it (one forward pass:
    the two greedy sequences are equal exactly when each of our tokens is transformers' argmax there)."""
    ours, tok, ref = models
    ids = tok.encode_chat([{"role": "user", "content": prompt}])
    got = greedy(ours, ids, NEW_TOKENS, tok.stop_ids)
    want = ref(torch.tensor([ids + got])).logits[0, len(ids) - 1 : -1].argmax(-1).tolist()
    assert got == want, (tok.decode(got), tok.decode(want))
    assert len(got) >= 32, f"the reply ended after {len(got)} tokens: pick a prompt with a longer answer"
