"""A chat that outgrows the context window leaves out its oldest plain exchanges first: the attached document
and the system prompt stay, and the user is told in plain words what the model no longer sees.

Before, the engine left out the oldest messages whatever they held, and the document (usually the first
message) went first: the next answer talked about nothing."""

from __future__ import annotations

import pytest
from app_support import make_app, notices, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app import paste_budget

pytestmark = pytest.mark.anyio

DOCUMENT = " ".join(f"fact{i}" for i in range(120))
ANSWER = " ".join(f"answer{i}" for i in range(30))


async def test_the_document_stays_and_the_oldest_exchange_goes(tmp_path):
    engine = FakeEngine(replies=[ANSWER], context_window=300)
    app, _ = make_app(tmp_path, engine, system_prompt="Answer from the document.")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await app.attachments.attach_text(DOCUMENT, name="facts.txt")
        await wait_until(lambda: app.attachment.tokens is not None)
        questions = ["Summarise it.", *(f"question number {n} about the facts" for n in range(1, 5))]
        for n, question in enumerate(questions):
            await send(app, pilot, question)
            await wait_until(lambda n=n: len(engine.calls) == n + 1 and not app.generating)
        last = engine.calls[-1].messages
        assert last[0]["content"].startswith(DOCUMENT)  # the document is still the first thing the model sees
        assert last[-1]["content"] == questions[-1]
        assert all(m["content"] != questions[1] for m in last)  # the oldest plain exchange went
        assert engine.sessions[-1].system_prompt == "Answer from the document."
        said = await notices(app, "longer than the model can keep")
        assert said and "oldest question" in said[-1]
        assert "It still sees the system prompt and your documents" in said[-1]
        # Everything stays on screen and in the history: only what the model is sent changes.
        assert len(app.chat.messages) == 2 * len(questions)


def test_documents_go_last_and_only_when_nothing_else_is_left():
    roles = ["user", "assistant"] * 3
    counts = [140, 10, 10, 10, 10, 10]  # a document in the first exchange
    assert paste_budget.left_out(counts, roles, {0}, 300, 75) == [2, 3]  # the plain one goes, not the document
    assert paste_budget.left_out(counts, roles, {0}, 200, 50) == [0, 1, 2, 3]  # it cannot fit: it goes too
    assert paste_budget.left_out(counts, roles, {0}, 1000, 75) == []
