"""A depth-bounded suffix trie over one token sequence, with occurrence counts, grown one token at a time.

Why a trie of every suffix (SuffixDecoding, arXiv 2411.04975): a draft should continue the *longest*
earlier match of what was just said, and where earlier text continued that match in several ways, the
continuation seen most often is the best single guess; its share of the occurrences says how far a
guess chain is worth extending. Every substring of length <= depth is a path from the root, so
appending a token only extends the `depth` paths of the current suffixes (O(depth) dict operations,
no rebuild as a pasted document or a reply grows), and truncating undoes exactly those steps.

Memory: at most `depth` nodes per token (a slot in each of nine lists and arrays of ints, and one dict entry),
~2.7 MB per 1,000 tokens of a pasted manual page at depth 16. Each node links to its newest child and next
sibling, so `tree` can list a match's continuations without scanning the dict, and to its suffix (its string
less the first token), so a guess chain moves from one longest match to the next in a step or two instead of
re-reading every suffix. What every append updates (counts, best and newest child) sits in lists, which index
~20% faster than arrays and are no larger (their small ints and token ids are shared objects); the links, each
a node number of its own, stay in arrays.
"""

from __future__ import annotations

from array import array

_SHIFT = 21  # child key = node << _SHIFT | token: token ids must be < 2**21 (every vocabulary is)


class SuffixTrie:
    """Every substring of `ids` up to `depth` tokens, each node counting how often its string occurred."""

    def __init__(self, depth: int = 16) -> None:
        if depth < 2:
            raise ValueError(f"suffix trie depth={depth}: need at least 2")
        self.depth = depth
        self.ids: list[int] = []
        self._child: dict[int, int] = {}  # node << _SHIFT | token -> child node
        self._count = [0]  # occurrences of the node's string
        self._out = [0]  # occurrences followed by a token (sum of the children's counts)
        self._best = [-1]  # the child token seen most often (the newest among equals); -1: none
        self._best_count = [0]  # that child's count
        self._newest = [-1]  # the child token that followed the node's string most recently
        self._token = array("l", [-1])  # the token that leads to the node
        self._first = array("l", [-1])  # the node's newest child (-1: none); siblings chain through _next
        self._next = array("l", [-1])
        self._link = array("l", [0])  # the node of the string less its first token (the root's: itself)
        self._active: list[int] = [0]  # the node of each suffix of `ids`, by length 0..depth-1
        self._block = 1  # _active[_block:]: nodes the last append made (childless, numbered in a row)

    def __len__(self) -> int:
        return len(self.ids)

    def sync(self, context: list[int]) -> None:
        """Make the trie hold exactly `context`: extend it when `context` extends `ids`, else undo the
        tokens past the common prefix first (a new turn that re-renders the end of the last one)."""
        ids = self.ids
        n = min(len(ids), len(context))
        if ids[:n] != context[:n]:
            n = next(i for i, (a, b) in enumerate(zip(ids, context, strict=False)) if a != b)
        if n < len(ids) - 4 * self.depth:  # cheaper to read it all again than to undo that much
            self.__init__(self.depth)
        elif n < len(ids):
            self.truncate(n)
        for t in context[len(self.ids):]:
            self.append(t)

    def append(self, token: int) -> None:
        child, count, out, best, best_count = self._child, self._count, self._out, self._best, self._best_count
        newest, first = self._newest, self._first
        suffixes, block, active, seen = self._active, self._block, [0], 0
        for node in suffixes[:block]:  # the suffixes that occurred followed by `token` before: count one more
            c = child.get(node << _SHIFT | token)
            if c is None:  # nor did any longer one (every node's string has all its suffixes in the trie)
                break
            n = count[c] = count[c] + 1
            out[node] += 1
            if n >= best_count[node]:
                best[node], best_count[node] = token, n
            newest[node] = token
            active.append(c)
            seen += 1
        # The longer suffixes never occurred followed by `token`: one new node each, made in bulk (a paste makes
        # ~depth a token). Those of them the last append made (`block` on) are childless and numbered in a row.
        m, c = len(suffixes) - seen, len(count)
        count.extend([1] * m)
        out.extend([0] * m)
        best_count.extend([0] * m)
        best.extend([-1] * m)
        newest.extend([-1] * m)
        first.extend(array("l", [-1]) * m)
        self._token.extend(array("l", [token]) * m)
        older = suffixes[seen:block]  # parents that may have children already
        self._next.extend([first[node] for node in older])
        self._next.extend(array("l", [-1]) * (m - len(older)))
        child.update(zip([node << _SHIFT | token for node in suffixes[seen:]], range(c, c + m), strict=True))
        for node in older:
            first[node] = c
            c += 1
            out[node] += 1
            if best_count[node] <= 1:
                best[node], best_count[node] = token, 1
            newest[node] = token
        if block < len(suffixes):
            b0, b1 = suffixes[block], suffixes[block] + len(suffixes) - block
            first[b0:b1] = array("l", range(c, c + b1 - b0))
            out[b0:b1] = best_count[b0:b1] = [1] * (b1 - b0)
            best[b0:b1] = newest[b0:b1] = [token] * (b1 - b0)
        self.ids.append(token)
        suffixes = [*active, *range(len(count) - m, len(count))]  # the new suffixes by length, 0..len
        self._link.extend(suffixes[seen : seen + m])  # a new node's suffix is the one a token shorter
        self._active = suffixes[: self.depth]
        self._block = 1 + seen

    def truncate(self, n: int) -> None:
        """Forget the tokens from position n on (undo their appends). Counts are restored exactly; a
        node's best-child mark stays on a child that still occurred, which may no longer be the most
        frequent one (drafts get a little worse until the context grows past it; output never changes)."""
        if n <= 0:
            self.__init__(self.depth)
            return
        ids, child, count, out, best, best_count = (self.ids, self._child, self._count, self._out, self._best,
                                                    self._best_count)
        for end in range(len(ids), n, -1):  # undo the appends of ids[n:], newest first
            token = ids[end - 1]
            for start in range(max(0, end - self.depth), end):  # the paths ids[start:end] that append made
                node = 0
                for t in ids[start : end - 1]:
                    node = child[node << _SHIFT | t]
                c = child[node << _SHIFT | token]
                count[c] -= 1
                out[node] -= 1
                if self._newest[node] == token and count[c] == 0:
                    self._newest[node] = best[node]  # the one before is not kept: a frequent child instead
                if out[node] == 0:
                    best[node], best_count[node] = -1, 0
                elif best[node] == token:  # still a child unless its count reached 0 (maybe no longer the
                    best_count[node] = count[c]  # most frequent: a worse guess, never a wrong one)
                    if count[c] == 0:
                        best[node] = self._most_frequent_child(node)
                        best_count[node] = count[child[node << _SHIFT | best[node]]]
        del ids[n:]
        self._active = [0]
        for start in range(max(0, n - self.depth + 1), n):
            node = 0
            for t in ids[start:n]:
                node = child[node << _SHIFT | t]
            self._active.insert(1, node)
        self._block = len(self._active)  # none of them is known to be childless

    def _most_frequent_child(self, node: int) -> int:
        best, best_count = -1, 0
        for key, c in self._child.items():  # children are not listed per node: scan (truncate only)
            if key >> _SHIFT == node and self._count[c] > best_count:
                best, best_count = key & ((1 << _SHIFT) - 1), self._count[c]
        return best

    def draft(self, k: int, min_share: float = 0.0, tail: list[int] | None = None,
              recency: bool = False) -> tuple[list[int], list[float]]:
        """Up to k tokens continuing `ids` + `tail` (tail: tokens not added to the trie), each the most
        frequent continuation of the longest earlier match, and each guess's share of that match's
        continuations (an empirical probability). Stops where the share falls below `min_share` or
        nothing earlier matches. `recency`: the newest continuation instead, unless the most frequent one
        occurred more than twice as often (a reply that rephrases a passage repeats its own newest wording)."""
        child, out, best, newest, count = self._child, self._out, self._best, self._newest, self._count
        active = self._active
        for t in tail or ():
            active = self._advance(active, t)
        node, length = self._longest(active)
        draft: list[int] = []
        shares: list[float] = []
        while len(draft) < k and node:
            x = best[node]
            if recency and newest[node] != x and newest[node] >= 0:
                fresh = count[child[node << _SHIFT | newest[node]]]
                if fresh > 0 and 2 * fresh >= count[child[node << _SHIFT | x]]:
                    x = newest[node]
            share = count[child[node << _SHIFT | x]] / out[node]
            if share < min_share:
                break
            draft.append(x)
            shares.append(share)
            node, length = self._follow(node, length, x)
        return draft, shares

    def tree(self, k: int, min_score: float, width: int = 3, depth: int | None = None
             ) -> tuple[list[int], list[int], list[float]]:
        """Up to k guessed tokens continuing `ids` as a tree: the nodes whose running probability (the product
        of each guess's share of its match's continuations) is highest, at least `min_score`, each node's
        candidates the `width` most frequent continuations of the longest earlier match of its path.

        Returns tokens, parents (-1: a child of the context's end; else an earlier index) and each node's
        running probability, in the order the nodes were chosen (best first, a parent before its children,
        so any prefix is a tree), none deeper than `depth`. With one candidate per node this is `draft`'s chain."""
        import heapq

        count, out = self._count, self._out
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        heap: list[tuple[float, int, int, int, int, int, int]] = []  # (-score, order, parent, depth, token,
        order = 0  # and the parent's longest match with a follower and its length)
        depth = depth or k

        def offer(parent: int, score: float, d: int, node: int, length: int) -> None:
            nonlocal order
            if node == 0 or d > depth:
                return
            for x, c in self._children(node, width):
                share = count[c] / out[node]
                if score * share >= min_score:
                    heapq.heappush(heap, (-score * share, order, parent, d, x, node, length))
                    order += 1

        offer(-1, 1.0, 1, *self._longest(self._active))
        while heap and len(tokens) < k:
            neg, _, parent, d, x, node, length = heapq.heappop(heap)
            tokens.append(x)
            parents.append(parent)
            scores.append(-neg)
            offer(len(tokens) - 1, -neg, d + 1, *self._follow(node, length, x))
        return tokens, parents, scores

    def _children(self, node: int, width: int) -> list[tuple[int, int]]:
        """The node's `width` most frequent continuations (token, child), the best child first."""
        count, token, nxt = self._count, self._token, self._next
        kids = []
        c = self._first[node]
        while c >= 0:
            if count[c] > 0:
                kids.append((token[c], c))
            c = nxt[c]
        best = self._best[node]
        kids.sort(key=lambda tc: (tc[0] != best, -count[tc[1]]))  # stable: the newest first among equals
        return kids[:width]

    def match_length(self, tail: list[int] | None = None) -> int:
        """Tokens in the longest suffix of `ids` + `tail` that occurred earlier followed by a token."""
        active = self._active
        for t in tail or ():
            active = self._advance(active, t)
        return self._longest(active)[1]

    def _longest(self, active: list[int]) -> tuple[int, int]:
        """The longest suffix in `active` that occurred followed by a token, and its length (the root, 0: none)."""
        out = self._out
        length = len(active) - 1
        while length and out[active[length]] == 0:
            length -= 1
        return active[length], length

    def _follow(self, node: int, length: int, token: int) -> tuple[int, int]:
        """`_longest` after reading `token` past a match `node` of `length` tokens that `token` followed: the
        match grown by the token, then shorter by suffix links until something followed it (never a string of
        `depth` tokens: the trie holds nothing longer). What `_longest(_advance(active, token))` finds, without
        the other suffixes."""
        out, link = self._out, self._link
        node, length = self._child[node << _SHIFT | token], length + 1
        while length and out[node] == 0:
            node, length = link[node], length - 1
        return node, length

    def _advance(self, active: list[int], token: int) -> list[int]:
        """The suffix nodes after reading `token` (without adding it): those whose path extends by it."""
        child = self._child
        nxt = [0]
        for node in active:
            c = child.get(node << _SHIFT | token)
            if c is None:
                break  # a shorter suffix may still extend, but a longer one cannot: keep lengths contiguous
            nxt.append(c)
        return nxt[: self.depth]
