"""`--quant gguf` on the CPU keeps the embedding table in the file's own blocks: each pass decodes the rows of
its tokens (`EmbeddingOnUse`), so the fp32 table (2.1 GB at 8B) is never made. The rows are bitwise those of
the whole-table decode, whichever entry point the pass comes by (one sequence, a tree, a batch of several),
a tied head is packed from the table's row blocks, and a damaged row is refused when it is looked up."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from tiny_models import reference_model, tiny_config, write_gguf

from parley.models import gguf_weights
from parley.models.errors import ModelLoadError
from parley.models.gguf_int4 import Imported
from parley.models.gguf_weights import open_gguf
from parley.models.loading import load_model
from parley.models.native_step import NativeStep
from parley.models.read_on_use import EmbeddingOnUse
from parley.models.resolve import resolve

T = gguf.GGMLQuantizationType
SEED = 11


def tiny_gguf(tmp_path, tied: bool, table: T | None):
    config = tiny_config(tied=tied)
    config["intermediate_size"] = 128  # every linear's inputs a multiple of 32
    name = f"tiny-{'tied' if tied else 'untied'}-{table.name if table else 'F32'}.gguf"
    return write_gguf(tmp_path / name, reference_model(config, seed=SEED), config, linears_as=T.Q4_0,
                      embedding_as=table)


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize(("tied", "table"), [(False, T.Q8_0), (True, T.Q4_0), (True, None)])
@torch.no_grad()
def test_the_table_is_never_held_and_every_pass_is_the_same(tmp_path, tied: bool, table: T | None,
                                                            monkeypatch) -> None:
    files = resolve(str(tiny_gguf(tmp_path, tied, table)))
    eager = load_model(files, gguf_int4=Imported())  # the whole table decoded to fp32 at load
    lazy = load_model(files, gguf_int4=Imported(), int4_on_use=True)

    def whole(tensor, path):
        raise AssertionError(f"{tensor.name} decoded whole")

    monkeypatch.setattr(gguf_weights, "dequantize", whole)  # a tied head too is packed from row blocks
    assert isinstance(lazy.embed_tokens, EmbeddingOnUse) and not isinstance(eager.embed_tokens, EmbeddingOnUse)
    step_e, step_l = NativeStep.for_model(eager, head_bits=8), NativeStep.for_model(lazy, head_bits=8)

    a, b = ids(9, SEED), ids(5, SEED + 1)
    one = [step(torch.tensor([a]), torch.arange(9)[None], m.new_cache(64))
           for step, m in ((step_e, eager), (step_l, lazy))]
    assert torch.equal(one[1], one[0])
    tree = [step.tree(a[:4], [-1, 0, 0, 1], 0, m.new_cache(64)) for step, m in ((step_e, eager), (step_l, lazy))]
    assert torch.equal(tree[1], tree[0])
    both = [step.batch([(m.new_cache(64), a, list(range(9)), None, 0), (m.new_cache(64), b, list(range(5)), None, 2)])
            for step, m in ((step_e, eager), (step_l, lazy))]
    for got, want in zip(both[1], both[0], strict=True):  # each row its own token's: the order kept in the batch
        assert torch.equal(got, want)
    # the PyTorch path's embedding too
    assert torch.equal(lazy.embed(torch.tensor([a])), eager.embed(torch.tensor([a])))
    assert lazy.embed_tokens._parameters["weight"].is_meta, "the table was decoded whole"


def test_a_nan_in_a_looked_up_row_is_refused_and_the_rest_still_runs(tmp_path) -> None:
    path = tiny_gguf(tmp_path, tied=False, table=T.Q8_0)
    token = 200
    block = next(t for t in open_gguf(path).tensors if t.name == "token_embd.weight").data[token, :34].tobytes()
    raw = bytearray(path.read_bytes())
    at = raw.find(block)
    assert at > 0 and raw.find(block, at + 1) < 0, "the block is not unique in the file"
    raw[at : at + 2] = np.array([np.nan], dtype=np.float16).tobytes()  # the row's first block scale d
    path.write_bytes(bytes(raw))
    lazy = load_model(resolve(str(path)), gguf_int4=Imported(), int4_on_use=True)
    step = NativeStep.for_model(lazy, head_bits=8)  # an untied model never decodes the table whole
    with pytest.raises(ModelLoadError, match=r"embed_tokens\.weight.*NaN"):
        step(torch.tensor([[5, token]]), torch.arange(2)[None], lazy.new_cache(64))
    logits = step(torch.tensor([[5, 6]]), torch.arange(2)[None], lazy.new_cache(64))
    assert torch.isfinite(logits).all()
