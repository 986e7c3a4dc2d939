"""Stop strings cut the streamed text exactly where they begin, even when one spans several deltas."""

from __future__ import annotations

import random

import pytest

from parley.app.server.api import StopMatcher


def cut(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    out, stopped = [], False
    for piece in pieces:
        text, stopped = matcher.push(piece)
        out.append(text)
        if stopped:
            break
    if not stopped:
        out.append(matcher.flush())
    return "".join(out), stopped


def test_stop_spanning_deltas_is_held_back_then_cut():
    assert cut(["\nUser:"], ["Hello", " there\n", "Us", "er: next"]) == ("Hello there", True)
    # A held-back tail that turns out not to be a stop string is let through.
    assert cut(["\nUser:"], ["a\n", "Use", "ful"]) == ("a\nUseful", False)
    assert cut(["END", "STOP"], ["xx ST", "OP yy END"]) == ("xx ", True)
    assert cut([], ["a", "b"]) == ("ab", False)


@pytest.mark.parametrize("seed", range(20))
def test_any_split_gives_the_same_cut(seed):
    rng = random.Random(seed)
    text = "".join(rng.choice("ab \n") for _ in range(60))
    stop = text[rng.randrange(10, 50):][:3]
    expected = text[: text.index(stop)]
    bounds = sorted(rng.sample(range(1, len(text)), 12))
    pieces = [text[i:j] for i, j in zip([0, *bounds], [*bounds, len(text)], strict=True)]
    assert cut([stop], pieces) == (expected, True), f"seed={seed} stop={stop!r} pieces={pieces!r}"
