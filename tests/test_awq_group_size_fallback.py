"""Where an input size is not a multiple of the requested group size, the largest supported divisor is
used, one size for the whole model (a checkpoint's quantization_config holds a single group_size)."""

import pytest
from awq_tiny import outlier_model

from parley.models.quantize.awq import group_size_for, model_group_size


def test_per_layer_fallback():
    assert group_size_for(1536, 128) == 128
    assert group_size_for(576, 128) == 64  # SmolLM2's hidden size
    assert group_size_for(96, 128) == 32
    assert group_size_for(576, 32) == 32
    with pytest.raises(ValueError, match="divisible by none"):
        group_size_for(100, 128)


def test_one_size_for_the_model():
    assert model_group_size(outlier_model(dim=128, intermediate=256), 128) == 128
    assert model_group_size(outlier_model(dim=192, n_heads=4, n_kv_heads=2, intermediate=256), 128) == 64
