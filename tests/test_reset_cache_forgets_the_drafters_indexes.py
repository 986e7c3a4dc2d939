"""`Engine.reset_cache` forgets every cached token, the slots' drafter indexes included: a suffix trie rolled
back to a shared prefix rather than rebuilt may draft otherwise (`SuffixTrie.truncate` keeps a stale best
child), so a bench that starts each reply there would see a mode's first reply draft unlike its next ones."""

from tiny import tiny_engine

from parley.engine.events import consume
from parley.engine.params import GenerationParams


def test_a_reply_after_reset_drafts_from_an_empty_index():
    engine = tiny_engine(seed=5)
    params = GenerationParams(temperature=0, max_new_tokens=12, speculation="suffix")
    consume(engine.session().reply([{"role": "user", "content": "abc abc abc abc"}], params))
    held = [slot for slot in engine.pool.slots if slot.drafters]
    assert held, "the reply's slot indexed its context"
    engine.reset_cache()
    assert not any(slot.drafters for slot in engine.pool.slots)
    consume(engine.session().reply([{"role": "user", "content": "xyz"}], params))
    assert len([slot for slot in engine.pool.slots if slot.drafters]) == 1  # the new reply's own, fresh
