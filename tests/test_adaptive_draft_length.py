"""The draft length grows on full acceptance, shrinks on rejection, stays within 1..16 (and the live
k_max), and a drafter that keeps missing is paused with a doubling back-off, then tried again; a drafter whose
guesses carry scores drafts up to k_max whenever it is not paused."""

from parley.engine.speculation_pay import AdaptiveDraftLength


def test_grows_to_the_bound_and_shrinks_past_what_was_accepted():
    a = AdaptiveDraftLength(k_max=16)
    seen = []
    for _ in range(6):
        seen.append(a.k)
        a.update(a.k, a.k)
    assert seen == [4, 8, 16, 16, 16, 16]
    a.update(16, 3)
    assert a.k == 4
    a.update(4, 0)
    assert a.k == 1
    a.update(1, 0)
    assert a.k == 1  # never below 1 while drafting


def test_live_k_max_caps_it_and_16_is_the_ceiling():
    a = AdaptiveDraftLength(k_max=64)
    for _ in range(5):
        a.update(a.k, a.k)
    assert a.k == 16
    a.k_max = 3  # the slider moved mid-reply
    assert a.k == 3


def test_missing_drafter_is_paused_with_doubling_backoff():
    a = AdaptiveDraftLength(k_max=8, patience=3, max_pause=4)
    pattern = []
    for _ in range(30):
        k = a.k
        pattern.append(k)
        a.update(k, 0)  # every guess rejected; a paused round proposes nothing
    drafted = [i for i, k in enumerate(pattern) if k > 0]
    paused_runs, run = [], 0
    for k in pattern[drafted[0]:]:
        if k == 0:
            run += 1
        elif run:
            paused_runs.append(run)
            run = 0
    assert paused_runs[:4] == [1, 2, 4, 4]  # 1, 2, 4 rounds, then capped at max_pause
    tries = [len(run) for run in "".join("d" if k else " " for k in pattern).split()]
    assert tries[:4] == [3, 1, 1, 1]  # `patience` misses before the first pause, one try after each
    # One accepted token resets the back-off.
    while a.k == 0:
        a.update(0, 0)
    a.update(a.k, 1)
    for _ in range(3):
        a.update(a.k, 0)
    assert a.k == 0
    a.update(0, 0)
    assert a.k > 0


def test_guesses_the_scheduler_declines_rest_the_drafter_with_doubling_backoff():
    """Beside other replies the scheduler may verify none of a round's guesses; the drafter then rests 1, 2, 4, ...
    rounds (capped), and a round whose guesses are verified starts the back-off over."""
    a = AdaptiveDraftLength(k_max=8, max_pause=4)
    pattern = []
    for _ in range(20):
        k = a.k
        pattern.append(k)
        if k:
            a.decline()  # the scheduler gave this round's guesses no place in the pass
        a.update(0, 0)  # so it verified none
    rests = [len(run) for run in "".join("-" if k == 0 else "d" for k in pattern).split("d") if run]
    assert pattern[0] > 0 and rests[:4] == [1, 2, 4, 4], pattern
    while a.k == 0:
        a.update(0, 0)
    a.update(a.k, 0)  # guesses verified (none landed): the next decline rests one round again
    a.decline()
    a.update(0, 0)
    assert a.k == 0
    a.update(0, 0)
    assert a.k > 0


def test_a_long_match_ends_a_pause_that_misses_began_but_not_one_the_scheduler_did():
    """`SpeculationPolicy.plan` asks a drafter that knows its match length; a copyable span (RESUME_MATCH tokens
    of match) ends a pause after misses at once, with the back-off kept, while declined guesses keep resting."""
    from parley.engine.params import GenerationParams
    from parley.engine.speculation_pay import RESUME_MATCH, PassCost, SpeculationPolicy

    class Matching:
        cheap = True
        scored = True

        def __init__(self) -> None:
            self.length = 0

        def match_length(self, context: list[int]) -> int:
            return self.length

    drafter, params = Matching(), GenerationParams(draft_tokens=8)
    policy = SpeculationPolicy(PassCost(), k_max=8)
    for _ in range(3):  # three misses: a pause
        policy.length.update(policy.plan(drafter, [1], params, 99), 0)
    drafter.length = RESUME_MATCH - 1
    assert policy.plan(drafter, [1], params, 99) == 0  # a short match: still paused
    drafter.length = RESUME_MATCH
    assert policy.plan(drafter, [1], params, 99) > 0  # a span to copy: drafting again
    policy.length.update(1, 0)  # and it missed: the back-off goes on (two rounds now, not one)
    drafter.length = 0
    assert policy.plan(drafter, [1], params, 99) == 0
    policy.length.update(0, 0)
    assert policy.plan(drafter, [1], params, 99) == 0
    # declined guesses rest whatever the match, and the match is not even asked for (beside 7 other replies the
    # probe cost each of them ~0.05 ms a round, the trie cold after every pass)
    asked = []
    drafter.match_length = lambda context: asked.append(context) or 50
    fresh = SpeculationPolicy(PassCost(), k_max=8)
    fresh.declined()
    fresh.length.update(0, 0)
    assert fresh.plan(drafter, [1], params, 99) == 0 and asked == []
    fresh.length.update(0, 0)  # the rest is over: drafting again
    assert fresh.plan(drafter, [1], params, 99) > 0


def test_a_scored_drafter_is_not_ramped_but_pauses_as_any_other():
    """Suffix match's guesses carry scores that the scheduler weighs against the pass cost: after a round that
    landed 2 of 16 it proposes 16 again (the ramp would say 3, then 1, 2, 4, 8: a copy started late), while an
    unscored drafter (prompt lookup) is ramped; three misses in a row pause both alike."""
    from parley.engine.params import GenerationParams
    from parley.engine.speculation_pay import PassCost, SpeculationPolicy

    class Scored:
        cheap, scored = True, True

        def match_length(self, context: list[int]) -> int:
            return 0

    class Unscored:
        cheap, scored = True, False

    params = GenerationParams(draft_tokens=16)
    for drafter, after_partial in ((Scored(), 16), (Unscored(), 3)):
        policy = SpeculationPolicy(PassCost(), k_max=16)
        assert policy.plan(drafter, [1], params, 99) == (16 if drafter.scored else 4)
        policy.length.update(16, 2)  # 16 guessed, 2 landed
        assert policy.plan(drafter, [1], params, 99) == after_partial
        assert policy.plan(drafter, [1], params, room=5) == min(after_partial, 5)  # the window still bounds it
        for _ in range(3):
            policy.length.update(policy.plan(drafter, [1], params, 99), 0)
        assert policy.plan(drafter, [1], params, 99) == 0  # paused after three misses
    slider = GenerationParams(draft_tokens=6)  # the live bound applies to a scored drafter too
    assert SpeculationPolicy(PassCost(), k_max=16).plan(Scored(), [1], slider, 99) == 6
