"""On the CPU every kind of draft model runs the native step, as the target does: `--draft awq`, `--draft
self:N` and a separately loaded model are prepared by the same function as the target."""

from __future__ import annotations

import pytest
from awq_tiny import outlier_model, write_hf_dir

from parley.engine.engine import Engine
from parley.engine.events import consume
from parley.engine.params import GenerationParams
from parley.models import native_forward

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(write_hf_dir(outlier_model(seed=3), tmp_path_factory.mktemp("tiny") / "model"))


@pytest.mark.parametrize(("quant", "draft"), [("awq", "awq"), ("awq", "self:1"), ("none", "self"),
                                              ("none", "FOLDER")])
def test_the_draft_runs_the_native_step(folder, quant, draft):
    engine = Engine.load(folder, quant=quant, draft=folder if draft == "FOLDER" else draft, device="cpu")
    assert engine.step_kind == "native"
    assert engine.draft.cached.step_kind == "native", f"--draft {draft} (target --quant {quant}) runs PyTorch"
    # and it is the step that ran: the draft's cache holds the context after a reply that drafted, and
    # the answer is the plain one (temperature 0 is lossless)
    question = [{"role": "user", "content": "abc abc abc abc"}]
    drafted = consume(engine.session().reply(question, GenerationParams(temperature=0, max_new_tokens=12,
                                                                        speculation="draft")))
    plain = consume(engine.session().reply(question, GenerationParams(temperature=0, max_new_tokens=12,
                                                                      speculation="off")))
    assert engine.draft.cached.ids and drafted.stats.step == "native"
    assert drafted.text == plain.text
