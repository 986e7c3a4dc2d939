"""A tree pass (several draft candidates verified at once) gives every node, bitwise, the logits of the linear
pass over the path to it, and keeping one path leaves the cache as if only that path had been fed.

This is what makes tree verification exact at temperature 0 without tie allowances: a node's row must not
depend on its siblings, on the slot its K/V went to, nor on which 256-key block its ancestors fall in. Checked
for every KV cache type (INT4 weights, the default), trees that cross a block edge, branches forking at the
root and deep in the chain, and Gemma 3's sliding-window layers (head dim 256: the float attention path).
"""

from __future__ import annotations

import random

import pytest
import torch
from native_models import small_model
from test_native_step_gemma3 import gemma_model

from parley.engine.cached_model import CachedModel
from parley.models import native_forward
from parley.models.native_step import NativeStep
from parley.models.transformer import KV_CACHE_TYPES

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")

# parents of each node; the first few nodes are the chain (node m the child of m - 1)
TREES = {
    "forks": [-1, 0, 1, 2, 3, 4, 1, 6, 7, 3, 9, 9, 0, 12, 5, 14],
    "deep": [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 8, 12, 13, 14, 15, 16],
    "chain": [-1, 0, 1, 2, 3, 4, 5],
}


def paths(parents: list[int]) -> dict[int, list[int]]:
    """Each node's path from the root (node indices)."""
    out = {0: [0]}
    for m in range(1, len(parents)):
        out[m] = [*out[parents[m]], m]
    return out


def linear_logits(model, step, kind: str, prefix: list[int], path: list[int]) -> torch.Tensor:
    """The path's logits from a linear pass after `prefix` (prefilled in one pass, as the tree's cache is)."""
    cached = CachedModel(model, 600, kv_cache=kind, native=step)
    cached.forward(prefix, last_only=True)
    cached.commit(len(prefix))
    return cached.forward(path)


def check_tree(model, step, kind: str, prefix_len: int, parents: list[int], seed: int) -> None:
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    prefix = [rng.randrange(vocab) for _ in range(prefix_len)]
    tokens = [rng.randrange(vocab) for _ in parents]
    cached = CachedModel(model, 600, kv_cache=kind, native=step)
    cached.forward(prefix, last_only=True)
    cached.commit(len(prefix))
    tree = cached.forward_tree(tokens, parents)
    by_node = paths(parents)
    leaves = [m for m in range(len(parents)) if m not in parents]
    for leaf in leaves:
        nodes = by_node[leaf]
        ref = linear_logits(model, step, kind, prefix, [tokens[m] for m in nodes])
        for d, m in enumerate(nodes):
            assert torch.equal(tree[m], ref[d]), (
                f"seed={seed} kind={kind} prefix={prefix_len} parents={parents}: node {m} (depth {d}) differs from "
                f"the linear pass over its path {nodes[: d + 1]}")
    # keep the path to the deepest leaf off the chain, then one more token: as if only that path had been fed
    keep = max((by_node[m] for m in leaves), key=lambda p: (any(a != b for a, b in enumerate(p)), len(p)))
    cached.commit_path(keep)
    nxt = rng.randrange(vocab)
    after = cached.forward([nxt])
    ref = linear_logits(model, step, kind, prefix, [*(tokens[m] for m in keep), nxt])
    assert torch.equal(after[0], ref[-1]), (
        f"seed={seed} kind={kind} prefix={prefix_len} parents={parents}: after keeping path {keep} the next token's "
        "logits differ from the linear pass (the path's K/V were not moved into place)")


@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
@pytest.mark.parametrize("prefix_len", [40, 250])  # 250: the tree's keys cross the 256-key block edge
def test_tree_nodes_equal_linear_passes(kind: str, prefix_len: int) -> None:
    seed = 7 + prefix_len
    model = small_model(int4=True, seed=seed)
    step = NativeStep.for_model(model, head_bits=8)
    for name, parents in TREES.items():
        check_tree(model, step, kind, prefix_len, parents, seed + len(name))


@pytest.mark.parametrize("kind", ["fp", "int8"])
def test_tree_nodes_equal_linear_passes_sliding_windows(kind: str) -> None:
    seed = 31
    model = gemma_model(int4=True, seed=seed)
    step = NativeStep.for_model(model, head_bits=8)
    check_tree(model, step, kind, 250, TREES["forks"], seed)


def test_bad_trees_are_refused() -> None:
    model = small_model(int4=True, seed=3)
    cached = CachedModel(model, 600, native=NativeStep.for_model(model, head_bits=8))
    for parents in ([0, 0], [-1, 1], [-1, 0, 3, 1]):
        with pytest.raises(ValueError, match="parents"):
            cached.forward_tree([1] * len(parents), parents)
