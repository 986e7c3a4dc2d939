"""The bytes a native decode step reports reading (`NativeStep.weight_bytes`, what `parley bench decode`
divides by) count the output head as the step stores it: fp32, int8 rows or 4-bit groups, never twice."""
from __future__ import annotations

import pytest
from test_native_step_gemma3 import gemma_model

from parley.models import native_forward
from parley.models.native_step import NativeStep

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")


def test_each_head_is_counted_once_at_its_own_width() -> None:
    seed = 7
    model = gemma_model(True, seed)  # tied embeddings: the head is the embedding matrix
    c = model.config
    assert c.tie_embeddings
    read = {bits: NativeStep.for_model(model, head_bits=bits).weight_bytes for bits in (32, 8, 4)}
    fp_head = c.vocab_size * c.dim * 4
    padded = (c.vocab_size + 15) // 16 * 16 * c.dim  # head rows are packed in tiles of 16
    # The layers are the same in all three, so the difference is fp32 head bytes minus this head's bytes.
    head8 = fp_head - (read[32] - read[8])
    head4 = fp_head - (read[32] - read[4])
    assert c.vocab_size * c.dim <= head8 <= padded + 4 * c.vocab_size, f"seed {seed}: {read}"
    assert 0.5 * c.vocab_size * c.dim <= head4 <= 0.6 * padded, f"seed {seed}: {read}"
