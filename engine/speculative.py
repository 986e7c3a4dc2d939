"""Speculative decoding: drafters guess k tokens cheaply; the target checks them all in one pass.

`verify` is the exact rejection-sampling rule of Leviathan et al. / Chen et al. (2023): the emitted
tokens are distributed exactly as if the target had sampled them one at a time from `sampling.probs`.
Three drafters sit behind one protocol: `PromptLookup` (copy what followed the newest earlier match of
the last few tokens; no model), `SuffixMatch` (the most frequent continuation of the longest earlier
match, from a suffix trie over the whole conversation, or a tree of the likeliest ones; no model) and
`DraftModel` (a small model with the same tokenizer). `verify_tree` is the rule for a tree of
deterministic guesses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch
from torch import Tensor, nn

from ..models import native_cache
from ..models.device_prep import prepare_for_device
from ..models.native_step import NativeStep
from ..models.transformer import Transformer
from .cached_model import CachedModel, Step
from .params import GenerationParams
from .sampling import probs, sample, uniform
from .suffix_trie import SuffixTrie


@dataclass
class Proposal:
    """A drafter's guesses for one round, all the reply loop needs to verify them.

    tokens: the guesses, a chain (each follows the one before) unless `parents` says otherwise.
    q: the distributions [n, V] they were drawn from (a draft model); None for deterministic guesses (q is
    then one-hot on each). scores: a deterministic drafter's running probability that the first i + 1
    guesses all land (what `best_length` trades against the pass cost); None when it has none.
    parents: a tree: each guess's parent (-1: the pending token; else an earlier guess, so any prefix is a
    tree); None for a chain.
    """

    tokens: list[int] = field(default_factory=list)
    q: Tensor | None = None
    scores: list[float] | None = None
    parents: list[int] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def branches(self) -> bool:
        """Whether the guesses form a tree with a fork (a chain is verified by the one-pass chain rule)."""
        return self.parents is not None and any(p != i - 1 for i, p in enumerate(self.parents))

    def first(self, n: int) -> Proposal:
        """The first n guesses (a prefix of a tree is a tree: parents come before their children)."""
        return Proposal(self.tokens[:n], None if self.q is None else self.q[:n],
                        None if self.scores is None else self.scores[:n],
                        None if self.parents is None else self.parents[:n])


class Drafter(Protocol):
    name: str  # shown in the reply's figures: "prompt lookup", or which draft model
    cheap: bool  # no model pass: `auto` never pauses it (a miss costs only the verification of its guesses)
    # its guesses carry scores, which the scheduler weighs against the measured pass cost, so no ramp caps how
    # many it proposes (`SpeculationPolicy.plan`)
    scored: bool

    def propose(self, context: list[int], k: int, params: GenerationParams,
                generator: torch.Generator | None = None) -> Proposal:
        """Up to k guessed next tokens for `context` (a tree may hold more nodes than k; none deeper)."""
        ...


def verify(p: Tensor, draft: list[int], q: Tensor | None, generator: torch.Generator) -> list[int]:
    """Tokens to emit: the accepted prefix of `draft`, then one token sampled by the target.

    p: target distributions [len(draft) + 1, V] at each draft position and one past the last.
    Deterministic guesses (q None: one-hot): at each position draw from p exactly as plain decoding would (one
    `sample` per emitted token); the guess stands if the draw equals it, else the draw is emitted and the round
    ends. That is the rule below for a one-hot q (accepted with probability p(x); a rejection's token drawn from p
    without x), and it draws the generator exactly as plain decoding does: a seeded reply's text does not depend
    on how many guesses were verified (alone or beside other sequences, speculating or not).
    Else accept x with probability min(1, p(x)/q(x)); on the first rejection sample from normalize(max(0, p - q));
    if all are accepted, sample a bonus token from the last row of p.
    """
    p = p.cpu()
    q = q.cpu() if q is not None else None
    out: list[int] = []
    for i, x in enumerate(draft):
        if q is None:
            out.append(sample(p[i], generator))
            if out[-1] != x:
                return out
            continue
        px, qx = float(p[i, x]), float(q[i, x])
        if qx > 0 and float(torch.rand((), generator=generator)) * qx < px:
            out.append(x)
            continue
        residual = (p[i] - q[i]).clamp_min(0.0)
        total = float(residual.sum())
        # p == q leaves nothing to reject into; then p itself is the right distribution.
        out.append(sample(residual / total if total > 0 else p[i], generator))
        return out
    out.append(sample(p[len(draft)], generator))
    return out


def verify_greedy(best: list[int], draft: list[int], generator: torch.Generator | None) -> list[int]:
    """`verify` at temperature 0 for deterministic guesses, from each row's argmax (`sampling.greedy`): the same
    tokens (one-hot rows draw their argmax) and the same draws from `generator`, one per emitted token (None:
    no draws, for a reply whose generator nobody can replay: one without a seed)."""
    out: list[int] = []
    for i, x in enumerate(best[: len(draft) + 1]):
        if generator is not None:
            uniform(generator)
        out.append(x)
        if i == len(draft) or x != draft[i]:
            break
    return out


def verify_tree(dist: Callable[[int, list[int]], Tensor], tokens: list[int], parents: list[int],
                generator: torch.Generator) -> tuple[list[int], list[int]]:
    """Tokens to emit for a tree of deterministic guesses, and the path of nodes they keep.

    tokens/parents: node 0 is the pending token (parents[0] = -1), node m a guess following parents[m] < m.
    dist(node, emitted): the target's distribution at `node` after the tokens emitted so far (its path).
    At each node draw x from the target; if a child guessed x, descend into it, else emit x and stop. Every
    emitted token is thus drawn from exactly the distribution plain decoding would draw it from (the
    one-candidate rule with q one-hot, generalised): the output law is the target's. Temperature 0 is the
    argmax at each node."""
    kids: dict[int, dict[int, int]] = {}
    for m in range(1, len(tokens)):
        kids.setdefault(parents[m], {}).setdefault(tokens[m], m)
    node, path, out = 0, [0], []
    while True:
        x = sample(dist(node, out), generator)
        out.append(x)
        child = kids.get(node, {}).get(x)
        if child is None:
            return out, path
        path.append(child)
        node = child


def depth_first(parents: list[int]) -> list[int]:
    """An order of a tree's guesses (parents[i] < i, -1: the pending token) that visits each node's children
    in index order, depth first: the guesses a drafter chose first (its likeliest path) come first, as a chain
    the native step reads from the cache as is, and each other branch's nodes together."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    order: list[int] = []
    stack = list(reversed(kids.get(-1, [])))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(kids.get(i, [])))
    return order


class PromptLookup:
    """Guesses from the context itself: find the newest earlier occurrence of the last n tokens
    (longest n first, max_n down to min_n) and propose the tokens that followed it. Costs no model
    pass; proposes nothing when nothing matches, so free chat pays nothing.

    An index {n-gram: newest start that has a follower} per n is extended incrementally as the
    context grows, so a round costs a few dict lookups rather than a rescan of a long pasted
    document; it is rebuilt only when the context stops extending the one indexed (a new turn that
    edits history).
    """

    name = "prompt lookup"
    cheap = True  # no model pass: `auto` never pauses it (a miss costs only the verification of its guesses)
    scored = False

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt lookup n-gram sizes min_n={min_n}, max_n={max_n}: need 1 <= min_n <= max_n")
        self.min_n, self.max_n = min_n, max_n
        self._ids: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}

    def fork(self) -> PromptLookup:
        """A drafter of the same settings with an empty index (one per sequence: see session.own_drafter)."""
        return PromptLookup(self.min_n, self.max_n)

    def propose(self, context: list[int], k: int, params: GenerationParams | None = None,
                generator: torch.Generator | None = None) -> Proposal:
        if k <= 0:
            return Proposal()
        self._extend(context)
        n_ctx = len(context)
        for n in range(min(self.max_n, n_ctx - 1), self.min_n - 1, -1):
            start = self._index[n].get(tuple(context[-n:]))
            if start is not None:
                return Proposal(context[start + n : start + n + k])
        return Proposal()

    def _extend(self, context: list[int]) -> None:
        """Index every n-gram of `context` that has at least one token after it."""
        old = len(self._ids)
        if len(context) < old or context[:old] != self._ids:
            self._ids, old = [], 0
            for table in self._index.values():
                table.clear()
        self._ids.extend(context[old:])
        ids, new = self._ids, len(context)
        for n, table in self._index.items():
            # starts s with s + n <= new - 1; those up to old - n - 1 are already in
            for s in range(max(0, old - n), new - n):
                table[tuple(ids[s : s + n])] = s  # later starts overwrite: the newest wins


class SuffixMatch:
    """Guesses from everything said so far (the pasted document, every turn, the replies already given):
    the continuation that most often followed the longest earlier match of the context's end, chained
    token by token (SuffixDecoding's single best path). Deterministic, so verification treats q as
    one-hot; proposes nothing when nothing matches. With `width` > 1 it proposes a tree instead: the
    candidates with the highest running probability, up to `width` per node and `nodes` per token of
    depth (`parents` says which guess each follows), for a target that verifies a tree in one pass.

    Draft length adapts to the evidence: at most `per_match` tokens per token of match (a one-token
    match of "the" is worth a guess or two, a 12-token match a long copy), and the chain stops where
    its running probability (the product of each guess's share of the continuations seen) falls below
    `min_score`. The trie grows with the context (no rebuild per token).
    """

    name = "suffix match"
    cheap = True  # no model pass: `auto` never pauses it (a miss costs only the verification of its guesses)
    scored = True  # each guess's running probability (see propose)

    def __init__(self, depth: int = 16, per_match: float = 2.0, min_score: float = 0.2, width: int = 1,
                 nodes: float = 1.0, recency: bool = False) -> None:
        self.trie = SuffixTrie(depth)
        self.recency = recency  # the newest continuation where it is about as frequent (`SuffixTrie.draft`)
        self.per_match, self.min_score, self.width, self.nodes = per_match, min_score, width, nodes
        self.name = "suffix tree" if width > 1 else "suffix match"

    def propose(self, context: list[int], k: int, params: GenerationParams | None = None,
                generator: torch.Generator | None = None) -> Proposal:
        """Scores: each guess's running probability; with width > 1, parents: several candidates where the
        counts leave the next token in doubt, verified in one pass."""
        if k <= 0 or not context:
            return Proposal()
        self.trie.sync(context)
        k = min(k, int(self.per_match * self.trie.match_length()))
        if self.width > 1:  # the best nodes first (any prefix of them is a tree), `nodes` per token of depth
            draft, parents, scores = self.trie.tree(min(16, int(self.nodes * k)), self.min_score, self.width, depth=k)
            return Proposal(draft, scores=scores, parents=parents)
        draft, shares = self.trie.draft(k, recency=self.recency)
        scores: list[float] = []
        score = 1.0
        for i, share in enumerate(shares):
            score *= share
            if score < self.min_score:
                del draft[i:]
                break
            scores.append(score)
        return Proposal(draft, scores=scores)

    def match_length(self, context: list[int]) -> int:
        """How many tokens at the context's end occur earlier in it (with a token after), for `SpeculationPolicy`
        to see a copyable span begin while drafting is paused; costs what a proposal's match does."""
        self.trie.sync(context)
        return self.trie.match_length()

    def reset(self) -> None:
        self.trie = SuffixTrie(self.trie.depth)

    def fork(self) -> SuffixMatch:
        """A drafter of the same settings with an empty trie (one per sequence: see session.own_drafter)."""
        return SuffixMatch(self.trie.depth, self.per_match, self.min_score, self.width, self.nodes, self.recency)


class VocabularyMismatch(ValueError):
    """The draft model's tokenizer is not the target's: its token ids would mean other text."""


def check_same_vocabulary(draft_tokenizer, target_tokenizer) -> None:
    """Raise VocabularyMismatch naming both vocabularies unless the two tokenizers agree id for id."""
    dv, tv = draft_tokenizer.vocab_size, target_tokenizer.vocab_size
    if dv != tv:
        raise VocabularyMismatch(
            f"the draft model's tokenizer has a vocabulary of {dv} tokens, the target's has {tv}: a draft model "
            "must share the target's tokenizer (pick one from the same model family)")
    if hasattr(draft_tokenizer, "vocab") and hasattr(target_tokenizer, "vocab"):
        d, t = draft_tokenizer.vocab(), target_tokenizer.vocab()
        if d != t:
            diff = sorted({tok for tok, _ in set(d.items()) ^ set(t.items())})[:3]
            examples = ", ".join(f"{tok!r}: draft {d.get(tok)} / target {t.get(tok)}" for tok in diff)
            raise VocabularyMismatch(
                f"the draft model's tokenizer ({len(d)} entries) and the target's ({len(t)} entries) map tokens "
                f"to different ids (e.g. {examples}): a draft model must share the target's tokenizer")


class DraftModel:
    """A small model with the target's tokenizer, drafting with the same sampling transform.

    Its cache follows the target's without being told about accepts and rejects: each round `sync`
    keeps the longest common prefix of what it holds and the context it is given, and feeds the rest
    (usually the one or two tokens the target just decided). Drafting stops early when the draft's
    own top probability at a position falls below `min_confidence`, where a guess is likely wasted.
    """

    def __init__(self, model: Transformer, tokenizer, target_tokenizer, *, min_confidence: float = 0.3,
                 max_len: int | None = None, vocab_size: int | None = None, name: str = "draft model",
                 native: Step | None = None) -> None:
        """`model` as `prepare_for_device` left it, with the native step it returned (if any)."""
        check_same_vocabulary(tokenizer, target_tokenizer)
        if model.config.vocab_size < tokenizer.vocab_size:
            raise VocabularyMismatch(f"the draft model has {model.config.vocab_size} output rows, fewer than its "
                                     f"tokenizer's vocabulary of {tokenizer.vocab_size} tokens")
        self.model = model.eval()
        self.name = name
        self.cheap = False  # each guess is a draft-model pass: `auto` pauses it when it does not pay
        self.scored = False  # each guess costs a draft pass before the target's: the ramp bounds how many
        self.min_confidence = min_confidence
        self.max_len = max_len or min(model.config.max_seq_len, 8192)
        self.vocab_size = vocab_size  # the target's logit width, when it differs from the draft's (padding)
        self.native = native
        self._cached: CachedModel | None = None  # its cache is allocated on first use

    @property
    def cached(self) -> CachedModel:
        if self._cached is None:
            self._cached = CachedModel(self.model, self.max_len, native=self.native)
        return self._cached

    @classmethod
    def self_draft(cls, target: Transformer, n_layers: int, tokenizer, *, native: bool = True,
                   target_step: NativeStep | None = None, **kw) -> DraftModel:
        """Layer-skip drafting: the target's first `n_layers` blocks, its final norm and head, sharing
        the target's weights (nothing is copied: with the target's native step, `target_step`, the draft's step
        is a view of its first layers). Works offline with any model; how well its guesses match depends on
        how much the skipped layers change the argmax. `native`: whether the target runs the native step (the
        draft then does too)."""
        if not 1 <= n_layers <= target.config.n_layers:
            raise ValueError(f"self-draft layers={n_layers}: the target has {target.config.n_layers} layers")
        with torch.device("meta"):  # a shell; every module is then replaced by the target's own
            shell = Transformer(replace(target.config, n_layers=n_layers,
                                        layer_windows=target.config.layer_windows[:n_layers]))
        shell.embed_tokens = target.embed_tokens
        shell.layers = nn.ModuleList(target.layers[:n_layers])
        shell.norm = target.norm
        shell.lm_head = target.lm_head
        shell.inv_freq = target.inv_freq
        if target.config.local_rope:  # Gemma 3's sliding-window layers have their own rope base
            shell.inv_freq_local = target.inv_freq_local
        kw.setdefault("name", f"self:{n_layers}")
        step = target_step.first_layers(n_layers) if target_step is not None and native else None
        return cls(shell, tokenizer, tokenizer, vocab_size=target.config.vocab_size,
                   native=step or prepare_for_device(shell, native=native), **kw)

    def propose(self, context: list[int], k: int, params: GenerationParams,
                generator: torch.Generator | None = None) -> Proposal:
        if k <= 0 or not context or len(context) + k > self.max_len:
            return Proposal()
        generator = generator or torch.default_generator
        cached = self.cached
        cached.sync(context[:-1])
        draft: list[int] = []
        rows: list[Tensor] = []
        feed = context[-1:]
        for _ in range(k):
            logits = cached.forward(feed)[-1]
            cached.commit(1)
            if self.vocab_size is not None:  # never guess an id the target has no row for (padded tables)
                logits = logits[: self.vocab_size]
            if float(torch.softmax(logits, -1).max()) < self.min_confidence:
                break
            q = probs(logits, params, history=[*context, *draft])
            # Drawn from q itself, on the generator's device: verification divides by exactly this q.
            x = int(q.argmax()) if params.temperature == 0 else sample(q.to(generator.device), generator)
            draft.append(x)
            rows.append(q)
            feed = [x]
        if not draft:
            return Proposal()
        q = torch.stack(rows)
        if self.vocab_size is not None and self.vocab_size > q.shape[-1]:  # the target's table is padded wider
            q = torch.nn.functional.pad(q, (0, self.vocab_size - q.shape[-1]))
        return Proposal(draft, q)

    def reset(self) -> None:
        if self._cached is not None:
            self._cached.rollback(0)


def load_draft(spec: str, target: Transformer, target_files, tokenizer, *, progress=None,
               group_size: int = 128, native: bool = True, target_step: NativeStep | None = None) -> DraftModel:
    """The draft model a `--draft` value names, for `target` loaded from `target_files`, prepared for
    its device as the target is (`native`: whether the target runs the native step, `target_step`).

    'self' or 'self:N': the target's first N layers (default a quarter) and its head, sharing weights.
    'awq': the target's own INT4 (AWQ) weights, quantized into the Parley cache on first use.
    Anything else: a model reference (hub id, directory, .gguf) whose tokenizer must be the target's.
    """
    from ..models.loading import load_model
    from ..models.resolve import resolve
    from ..models.tokenizer import load_tokenizer

    weight = target.norm.weight
    if spec == "self" or spec.startswith("self:"):
        n = spec.partition(":")[2]
        if n and not n.isdigit():
            raise ValueError(f"--draft {spec!r}: expected self:N with N a number of layers")
        return DraftModel.self_draft(target, int(n) if n else max(1, target.config.n_layers // 4), tokenizer,
                                     native=native, target_step=target_step, name=spec)
    if spec == "awq":
        from ..models.quantize.cache import ensure_quantized

        files = ensure_quantized(target_files, group_size=group_size, progress=progress)
        draft_tokenizer = tokenizer
    else:
        files = resolve(spec, progress=progress)
        draft_tokenizer = load_tokenizer(files)
    model = load_model(files, dtype=weight.dtype, device=weight.device, int4_on_use=native)
    place = native_cache.place_of(files) if native and weight.device.type == "cpu" else None
    return DraftModel(model, draft_tokenizer, tokenizer, vocab_size=target.config.vocab_size, name=spec,
                      native=prepare_for_device(model, native=native, progress=progress, place=place))
