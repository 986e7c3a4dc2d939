"""A conversation that outgrows the context window goes on: the session leaves out its oldest turns in
one block (down to half the window) and keeps leaving out the same ones, so the following turns reuse
the cache instead of re-reading the whole window every turn. Each reply equals a fresh engine's reply
to what the model was shown."""

from single_thread import single_thread  # noqa: F401
from tiny import tiny_engine

from parley.engine.events import Done, Notice, Stats, TextDelta
from parley.engine.params import GenerationParams

WINDOW = 256
TURNS = 40
PARAMS = GenerationParams(temperature=0, max_new_tokens=12, speculation="off")


def reply(session, messages):
    text, notices, stats = "", [], None
    for ev in session.reply(messages, PARAMS):
        if isinstance(ev, TextDelta):
            text += ev.text
        elif isinstance(ev, Notice):
            notices.append(ev.text)
        elif isinstance(ev, Stats):
            stats = ev
        done = ev
    return text, notices, stats, done


def test_wrapped_conversation_reuses_its_cache():
    eng = tiny_engine(seed=7, context_window=WINDOW)
    eng.tokenizer.stop_ids = frozenset()  # every reply is 12 tokens
    session = eng.session()
    messages: list[dict[str, str]] = []
    prefilled, all_notices, wraps = [], [], 0
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"turn {turn}: tell me more"})
        left_out = session.left_out
        text, notices, stats, done = reply(session, messages)
        assert done == Done("length", "max_new_tokens=12 reached"), (turn, done)
        all_notices += notices
        wraps += session.left_out != left_out
        prefilled.append(stats.prompt_tokens)
        shown = messages[session.left_out:]
        assert reply(tiny_engine(seed=7, context_window=WINDOW).session(), shown)[0] == text, turn
        messages.append({"role": "assistant", "content": text})
    # ~37 tokens a turn: the conversation (~1,500 tokens) wrapped several times...
    assert wraps >= 4 and len(all_notices) == wraps and "first" in all_notices[-1]
    # ...and only a turn that wraps re-reads much: every other turn prefills its new message only.
    print("prefilled per turn", prefilled, "wraps", wraps)
    big = [n for n in prefilled if n > 40]
    assert len(big) <= wraps + 1, prefilled
