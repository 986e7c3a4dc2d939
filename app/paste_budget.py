"""How much of a pasted document fits: the budget arithmetic, with no UI and no engine.

The window holds the conversation, the document, the chat template's framing and the room promised
for the reply. A paste that does not fit is cut at whole lines when it can be.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Chat templates add a few tokens per message (role headers, end markers); counted so that a paste
# truncated "to fit" still leaves the promised reply room.
TEMPLATE_TOKENS_PER_MESSAGE = 8


@dataclass(frozen=True)
class Budget:
    window: int  # the context window
    used: int  # tokens the conversation already takes (framing included)
    reserve: int  # kept back for the reply

    @property
    def free(self) -> int:
        """Tokens a document may take with the next message."""
        return max(0, self.window - self.used - self.reserve)


def budget(window: int, conversation_tokens: int, messages: int, max_new_tokens: int) -> Budget:
    """The budget for a document sent with the next message, after `messages` earlier ones."""
    reserve = min(max_new_tokens, window // 4)
    framing = TEMPLATE_TOKENS_PER_MESSAGE * (messages + 2)  # the earlier messages, the new one, the reply
    return Budget(window, conversation_tokens + framing, reserve)


def normalise_newlines(text: str) -> str:
    """CR and CRLF line endings (old Mac, Windows pastes) as LF, so lines count and fit as lines."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def fit_text(count_tokens: Callable[[str], int], text: str, limit: int) -> tuple[str, int]:
    """The longest prefix of `text` (whole lines when possible) within `limit` tokens, and its count."""
    ends = [i + 1 for i, c in enumerate(text) if c == "\n"]
    if not ends or ends[-1] != len(text):
        ends.append(len(text))

    def largest(cuts: list[int]) -> int:
        lo, hi, best = 0, len(cuts) - 1, -1
        while lo <= hi:
            mid = (lo + hi) // 2
            if count_tokens(text[: cuts[mid]]) <= limit:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best

    best = largest(ends)
    if best >= 0:
        kept = text[: ends[best]].rstrip("\n")
    else:  # not even the first line fits: cut inside it
        chars = list(range(1, ends[0] + 1))
        i = largest(chars)
        kept = text[: chars[i]] if i >= 0 else ""
    return kept, count_tokens(kept) if kept else 0


def too_long_message(tokens: int, b: Budget, text: str, kept: str, kept_tokens: int) -> str:
    lines, kept_lines = text.count("\n") + 1, (kept.count("\n") + 1 if kept else 0)
    return (
        f"It is {tokens:,} tokens, but only {b.free:,} fit: the context window is {b.window:,} tokens, "
        f"this conversation uses {b.used:,} and {b.reserve:,} are kept for the reply.\n\n"
        f"Truncate keeps the first {kept_lines:,} of {lines:,} lines ({kept_tokens:,} tokens). "
        "Nothing is cut unless you choose it."
    )


def exchanges(roles: list[str]) -> list[list[int]]:
    """The message indices grouped into exchanges: a user message and the replies after it."""
    groups: list[list[int]] = []
    for i, role in enumerate(roles):
        if role == "user" or not groups:
            groups.append([])
        groups[-1].append(i)
    return groups


def left_out(counts: list[int], roles: list[str], documents: set[int], window: int, max_new_tokens: int,
             system_tokens: int = 0) -> list[int]:
    """The messages to leave out, oldest exchanges first, so the conversation fits the window with the reply's
    room; exchanges that carry a document go only once every other one has (the system prompt always stays,
    and so does the last exchange). Leaving out down to 7/8 of the room spares a re-read on every turn."""
    framing = TEMPLATE_TOKENS_PER_MESSAGE * (len(counts) + 2) + system_tokens
    room = window - min(max_new_tokens, window // 4)
    total = sum(counts) + framing
    if total <= room:
        return []
    groups = exchanges(roles)[:-1]
    plain = [g for g in groups if not documents.intersection(g)]
    dropped: list[int] = []
    for group in plain + [g for g in groups if g not in plain]:
        # Plain exchanges go down to 7/8 of the room; a document only as far as it must.
        if total <= (room - window // 8 if group in plain else room):
            break
        dropped += group
        total -= sum(counts[i] for i in group) + TEMPLATE_TOKENS_PER_MESSAGE * len(group)
    return sorted(dropped)


def reply_room(counts: list[int], roles: list[str], documents: set[int], window: int, system_tokens: int = 0) -> int:
    """The tokens left for the reply once every earlier plain exchange is left out and the documents and the
    last exchange stay: how short a reply would have to be for no document to be dropped (<= 0: none fits)."""
    groups = exchanges(roles)
    kept = [i for g in groups[:-1] if documents.intersection(g) for i in g] + (groups[-1] if groups else [])
    return window - sum(counts[i] for i in kept) - TEMPLATE_TOKENS_PER_MESSAGE * (len(kept) + 2) - system_tokens


def left_out_words(dropped: list[int], roles: list[str], documents: dict[int, str], window: int,
                   system: bool) -> str:
    """What the model no longer sees, in chat words."""
    asks = sum(roles[i] == "user" for i in dropped)
    lost_docs = [documents[i] for i in dropped if i in documents]
    text = (f"This chat is now longer than the model can keep in mind ({window:,} tokens), so it no longer "
            f"sees your {asks} oldest question{'s' if asks != 1 else ''} and the answers to them.")
    if lost_docs:
        return text + " That includes the document " + ", ".join(lost_docs) + ": attach it again if you need it."
    kept = [what for what, there in (("the system prompt", system), ("your documents", bool(documents))) if there]
    return text + (f" It still sees {' and '.join(kept)}." if kept else "")


def fit_conversation(count: Callable[[str], int], window: int, messages: list[dict[str, str]],
                     documents: dict[int, str], system_prompt: str, max_new_tokens: int
                     ) -> tuple[list[dict[str, str]], str | None]:
    """`messages` as they fit the window (documents and the system prompt kept), and what was left out, in
    words (None when nothing was). Done here rather than left to the engine, which leaves out the oldest
    messages whatever they hold, and a document is usually the oldest."""
    roles = [m["role"] for m in messages]
    counts = [count(m["content"]) for m in messages]
    dropped = left_out(counts, roles, set(documents), window, max_new_tokens,
                       count(system_prompt) if system_prompt else 0)
    if not dropped:
        return messages, None
    gone = set(dropped)
    kept = [m for i, m in enumerate(messages) if i not in gone]
    return kept, left_out_words(dropped, roles, documents, window, bool(system_prompt))
