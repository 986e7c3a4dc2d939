"""A conversation's reply loop: prefix reuse and chunked prefill, then rounds of plan -> propose -> verify ->
commit -> emit, driven by the engine's scheduler (engine/scheduler.py) beside every other running reply."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from ..models.chat_template import RenderCancelled
from . import sampling, scheduler
from .cached_model import PREFILL_CHUNK, CachedModel
from .events import Done, Event, Notice, Prefill, Stats, TextDelta
from .params import GenerationParams, checked
from .prefix import common_prefix
from .reply_stats import ReplyStats
from .scheduler import SHARED_CHUNK, SYNC, Chunk, Guesses, Job, Reply, ReplyStream, Rows
from .speculation_pay import SpeculationPolicy
from .speculative import Drafter, Proposal, depth_first, verify, verify_greedy, verify_tree

if TYPE_CHECKING:
    from .engine import Engine

class Session:
    """One conversation. Its KV state lives in a slot of the engine's pool: each reply takes the free slot
    sharing the longest prefix with its prompt (its own conversation's, when free), so a follow-up turn only
    prefills what is new.

    A conversation longer than the window leaves out its oldest turns in one block, down to half the
    window, and goes on leaving out the same turns: the prompt's start stays put, so later turns keep
    reusing the cache until the window fills again (one re-prefill per half window, not one per turn).
    """

    def __init__(self, engine: Engine, system_prompt: str | None = None, raw: bool = False) -> None:
        self.engine = engine
        self.system_prompt = system_prompt
        # raw: continue the last message's text as written, no chat template (/v1/completions, `generate --raw`),
        # with the same loop, prefix cache and speculation as a chat reply
        self.raw = raw
        self.left_out = 0  # leading messages (after a system prompt) kept out of the window
        self.reply_ids: list[int] = []  # the token ids the last reply showed

    def reply(self, messages: list[dict[str, str]], params: GenerationParams,
              cancel: threading.Event | None = None) -> Iterator[Event]:
        """Stream the assistant's answer to `messages` (the whole visible conversation).

        `params` is read and validated again at the start of every round, so a change applies to the
        next tokens (an invalid one is reported by a Notice and the round keeps the last valid values).
        Replies of several sessions run at the same time, each in its own slot; past the pool's size a reply
        waits for a slot. On cancellation its slot holds exactly the prompt and the tokens already shown.
        """
        yield from self.start(messages, params, cancel)

    def start(self, messages: list[dict[str, str]], params: GenerationParams,
              cancel: threading.Event | None = None) -> ReplyStream:
        """`reply`, started now: the prompt is rendered in the caller's thread, then the reply is submitted to
        the engine's scheduler; the returned stream's `admitted` is set once it holds a slot (a server waits on
        it to notice a client that leaves while queued)."""
        cancel = cancel or threading.Event()
        figures = ReplyStats(self.engine.context_window)  # the reply's clock starts now, waiting included
        early: list[Event] = []
        first = params.snapshot()
        try:
            first.validate()
        except ValueError as e:  # nothing valid to fall back on yet
            return ReplyStream(None, [Done("error", str(e))])
        try:
            tokenizer = self.engine.tokenizer
            if not self.raw and (note := getattr(tokenizer, "template_note", None)):  # a base model: said once
                tokenizer.template_note = None
                early.append(Notice(note))
            prompt = self._prompt(messages, first, cancel)
            try:  # rendering the chat template is bounded in time and stops when the reply is cancelled
                while True:
                    early.append(next(prompt))
            except StopIteration as end:
                ids = end.value
        except RenderCancelled:
            return ReplyStream(None, [*early, Done("cancelled")])
        except Exception as e:
            return ReplyStream(None, [*early, Done("error", f"{type(e).__name__}: {e}")])
        window = self.engine.context_window
        if len(ids) >= window:
            return ReplyStream(None, [*early, Done("length", f"the conversation is {len(ids)} tokens; the context "
                                                            f"window holds {window}. Start a new chat or shorten "
                                                            "the message.")])
        job = Job(ids, lambda slot: self._reply(slot, ids, params, first, cancel, figures), cancel)
        self.engine.scheduler.submit(job)
        return ReplyStream(job, early)

    def _reply(self, target: CachedModel, ids: list[int], live: GenerationParams, params: GenerationParams,
               cancel: threading.Event, figures: ReplyStats) -> Reply:
        """The reply in slot `target`, as the scheduler drives it: yields events, and what it needs from the
        engine (prompt chunks to read, guesses to verify, rows of the next pass), receiving the answers.
        `params`: the valid snapshot of `live` the reply started with."""
        eng = self.engine
        # Prefill everything but the last prompt token; that one is the first input of round one, and the prompt's
        # last few tokens (`rest`, at most SHARED_CHUNK) ride in round one's pass with it.
        prefilled = yield from self._prefill(target, ids[:-1], cancel)
        if prefilled is None:
            yield Done("cancelled")
            return
        reused, rest = prefilled
        figures.reused_tokens = reused
        figures.prompt_tokens = len(ids) - figures.reused_tokens
        pending, generator, stream = ids[-1], sampling.make_generator(params.seed), eng.tokenizer.stream()
        policy, rejected = SpeculationPolicy(eng.pass_cost, params.draft_tokens), None
        self.reply_ids = []
        while True:
            yield SYNC  # the client has seen every token so far: its cancel and sliders are read now
            params, problem = checked(live, params)
            if problem and problem != rejected:
                yield Notice(problem)
            rejected, budget = problem, params.max_new_tokens - figures.new_tokens
            if end := self._end(target, len(rest), cancel, params, budget):
                reason, detail = end
                break
            started = scheduler.round_clock()
            context, drafter = [*target.ids, *rest, pending], own_drafter(target, eng.drafter(params.speculation))
            k = policy.plan(drafter, context, params, room=min(target.max_len - len(context), budget - 1))
            guess = yield from self._propose(drafter, context, k, params, generator, policy, len(rest),
                                             room=target.max_len - len(context))
            verifying = scheduler.round_clock()
            new, path, depth = yield from self._verify(target, guess, pending, rest, context, params, generator,
                                                       figures, timed=None if rest else verifying)
            policy.learn(guess, new, depth, verifying - started)
            shown, stopped = self._commit(target, new, path, len(rest), budget)
            rest = []
            figures.drafter = drafter.name if drafter and (figures.drafter or guess.tokens) else figures.drafter
            figures.speculation_note = policy.note
            yield from self._emit(shown, min(len(shown), len(new) - 1), len(guess), stream, figures)
            if stopped:
                reason, detail = "eos", ""
                break
            pending = shown[-1]
            if figures.due():
                yield self._stats(target, figures, pending=True)
        tail = stream.flush()
        if tail:
            yield TextDelta(tail)
        yield self._stats(target, figures, pending=reason != "eos")  # the final figures: the last Stats of a reply
        yield Done(reason, detail)  # type: ignore[arg-type]

    @staticmethod
    def _propose(drafter: Drafter | None, context: list[int], k: int, params: GenerationParams,
                 generator: torch.Generator, policy: SpeculationPolicy, rest: int, room: int) -> Reply:
        """The drafter's guesses for this round (none when `k` is 0), cut to those worth their share of the pass:
        the scheduler weighs their calibrated scores against the measured pass cost and what else the pass holds
        (other replies' rows; `rest` prompt rows of this one). Alone, at least one is verified, so the cost of
        longer passes and how well guesses land go on being measured. A tree's nodes (it may hold more than k)
        each take a slot of the window: at most `room`."""
        guess = drafter.propose(context, k, params, generator) if drafter and k > 0 else Proposal()
        if guess.scores:
            n = yield Guesses(policy.scores(guess), least=1, rows=1 + rest)
            if n == 0:
                policy.declined()
            guess = guess.first(min(n, room))
        return guess

    def _verify(self, target: CachedModel, guess: Proposal, pending: int, rest: list[int], context: list[int],
                params: GenerationParams, generator: torch.Generator, figures: ReplyStats,
                timed: float | None) -> Reply:
        """One target pass over the prompt's `rest`, the pending token and the guesses (a chain, or a tree where
        the slot's pass supports one); the verification rule then decides the tokens plain decoding would have
        drawn: the guesses it keeps and one more. Returns (the tokens decided, the pass rows they keep, or None
        for a chain's first rows; the deepest guess verified). `timed`: when the round reached its pass, for the
        scheduler's pass-cost samples (None: a pass carrying prompt rows is no sample of decoding's cost)."""
        r, draft = len(rest), guess.tokens
        if guess.branches and target.trees:
            order = depth_first(guess.parents)
            at = {i: n + 1 for n, i in enumerate(order)}  # guess -> node of the pass (node 0: the pending token)
            tokens = [pending, *(draft[i] for i in order)]
            nodes = [-1, *(at.get(guess.parents[i], 0) for i in order)]
            # the prompt's rest is a chain before the tree: node m of the tree is row r + m
            rows = Rows([*rest, *tokens], parents=[*range(-1, r), *(r + p for p in nodes[1:])], wanted=r,
                        ready=timed)
            logits = yield rows
            new, path, depth = self._verify_tree(logits, tokens, nodes, context, params, generator)
            path = [*range(r), *(r + m for m in path)]
        else:
            rows = Rows([*rest, pending, *draft], wanted=r, ready=timed)
            logits = yield rows
            if params.temperature == 0 and guess.q is None:
                new = verify_greedy(sampling.greedy(logits, params, history=context, drafted=draft), draft,
                                    generator if params.seed is not None else None)
            else:
                new = verify(sampling.probs(logits, params, history=context, drafted=draft), draft, guess.q, generator)
            path, depth = None, len(draft)
        figures.batch = rows.batch
        return new, path, depth

    def _commit(self, target: CachedModel, new: list[int], path: list[int] | None, rest: int,
                budget: int) -> tuple[list[int], bool]:
        """Keep in the slot's cache what the round shows: the prompt's `rest` rows, then the decided tokens up to
        a stop token (whose KV is never claimed) and the budget. Returns (the tokens shown, whether the reply
        stopped)."""
        shown, stopped = cut(new, self.engine.tokenizer.stop_ids, budget)
        kept = rest + (1 + len(shown) if stopped else len(shown))
        target.commit_path(path[:kept]) if path else target.commit(kept)
        return shown, stopped

    @staticmethod
    def _verify_tree(logits, tokens: list[int], nodes: list[int], context: list[int], params: GenerationParams,
                     generator) -> tuple[list[int], list[int], int]:
        """`verify_tree` over one tree pass's logits (node 0 the pending token, nodes[m] node m's parent): the
        tokens decided, the path of pass nodes they keep, and the tree's depth."""
        depth = [0] * len(nodes)
        for m in range(1, len(nodes)):
            depth[m] = depth[nodes[m]] + 1

        def dist(node: int, emitted: list[int]):  # the row plain decoding would draw from after `emitted`
            return sampling.probs(logits[node : node + 1], params, history=[*context, *emitted])[0]

        new, path = verify_tree(dist, tokens, nodes, generator)
        return new, path, max(depth)

    @staticmethod
    def _prefill(target: CachedModel, ids: list[int], cancel: threading.Event) -> Reply:
        """Put `ids` in the slot's cache, reusing its longest common prefix, in chunks the scheduler sizes, all
        but the last SHARED_CHUNK tokens at most (returned, for round one's pass); more than PREFILL_CHUNK to read
        reports `Prefill` progress (tokens of this reply's prompt read, of those to read), and a cancel stops
        between chunks (the cache then holds a prefix of `ids`). Returns (tokens reused, the rest), or None when
        cancelled."""
        reused = common_prefix(target.ids, ids)
        target.rollback(reused)
        at = reused
        while len(ids) - at > SHARED_CHUNK:
            yield SYNC
            if cancel.is_set():
                return None
            if len(ids) - reused > PREFILL_CHUNK:
                yield Prefill(at - reused, len(ids) - reused)
            n = 0
            while n == 0:  # the scheduler may give this pass's prompt budget to shorter prompts first
                n = yield Chunk(len(ids) - at - SHARED_CHUNK)
            chunk = ids[at : at + n]
            yield Rows(chunk, wanted=len(chunk))
            target.commit(len(chunk))
            at += len(chunk)
        return reused, ids[at:]

    @staticmethod
    def _end(target: CachedModel, rest: int, cancel: threading.Event, params: GenerationParams,
             budget: int) -> tuple[str, str] | None:
        """Why the reply ends before this round, if it does (`rest`: prompt tokens still to read with it)."""
        if cancel.is_set():
            return "cancelled", ""
        if budget <= 0:
            return "length", f"max_new_tokens={params.max_new_tokens} reached"
        if len(target.ids) + rest + 1 > target.max_len:  # no slot for the pending token
            return "length", f"context window of {target.max_len} tokens is full"
        return None

    def _emit(self, shown: list[int], drafted: int, proposed: int, stream, figures: ReplyStats) -> Iterator[Event]:
        """Count a round and stream its shown tokens; the first `drafted` of them were accepted guesses."""
        figures.round(proposed, len(shown), drafted)
        self.reply_ids += shown
        guessed = "".join(stream.push(t) for t in shown[:drafted])
        text = guessed + "".join(stream.push(t) for t in shown[drafted:])
        if text:
            yield TextDelta(text, draft_chars=len(guessed))

    def _stats(self, target: CachedModel, figures: ReplyStats, pending: bool) -> Stats:
        figures.context_tokens = len(target.ids) + pending
        # what the reply ran on, read from its slot itself (not from what was asked for)
        return replace(figures.stats(), kv_cache=target.cache.kind, step=target.step_kind)

    def _prompt(self, messages: list[dict[str, str]], params: GenerationParams,
                cancel: threading.Event | None = None) -> Iterator[Event]:
        """The prompt's token ids (the generator's return value), leaving out old turns when the
        conversation outgrows the window; says so by a Notice when that changes."""
        tokenizer, window = self.engine.tokenizer, self.engine.context_window
        if self.raw:  # BOS first when the model wants it (Gemma), as llama.cpp's raw mode
            text = messages[-1]["content"]
            return tokenizer.encode_raw(text) if hasattr(tokenizer, "encode_raw") else tokenizer.encode(text)
        head: list[dict[str, str]] = []
        if messages and messages[0]["role"] == "system":
            head, messages = messages[:1], messages[1:]
        elif self.system_prompt:
            head = [{"role": "system", "content": self.system_prompt}]
        if self.left_out >= len(messages):  # a different, shorter conversation
            self.left_out = 0
        ids = tokenizer.encode_chat(head + messages[self.left_out:], cancel=cancel)
        if len(ids) + min(params.max_new_tokens, window // 4) <= window:
            return ids
        n = self.left_out
        while len(ids) > window // 2 and n < len(messages) - 1:  # the last message always stays
            n += 1
            while n < len(messages) - 1 and messages[n]["role"] != "user":  # start on a user turn
                n += 1
            ids = tokenizer.encode_chat(head + messages[n:], cancel=cancel)
        if n != self.left_out and len(ids) < window:
            self.left_out = n
            yield Notice(f"This conversation is longer than the context window ({window} tokens): the model "
                         f"no longer sees its first {n} messages.")
        return ids


def cut(new: list[int], stop_ids, budget: int) -> tuple[list[int], bool]:
    """What a round shows of the tokens it decided: up to the first stop token (never shown; True says
    the reply ends there) and at most `budget` tokens."""
    for i, t in enumerate(new[:budget]):
        if t in stop_ids:
            return new[:i], True
    return new[:budget], False


def own_drafter(slot: CachedModel, drafter):
    """The slot's own instance of `drafter`: a drafter that indexes its context (prompt lookup, suffix match) is
    forked per slot (`fork()`: the same settings, an empty index), so sequences never rebuild each other's
    index; one without `fork` (a draft model) is shared."""
    if drafter is None or not hasattr(drafter, "fork"):
        return drafter
    mine = slot.drafters.get(id(drafter))
    if mine is None or mine[0] is not drafter:
        mine = slot.drafters[id(drafter)] = (drafter, drafter.fork())
    return mine[1]
