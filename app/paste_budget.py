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
