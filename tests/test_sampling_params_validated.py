"""Generation parameters are validated with errors that name the field, its value and the accepted
range; `checked` gives each round valid parameters, keeping the previous value of a field set wrong
mid-reply and saying why."""

import math

import pytest

from parley.engine.params import GenerationParams, checked

BAD = [("temperature", -1.0), ("temperature", 2.5), ("temperature", math.nan), ("temperature", math.inf),
       ("top_p", 0.0), ("top_p", 1.5), ("top_p", math.nan), ("top_k", -3), ("top_k", 2.5),
       ("min_p", 1.0), ("min_p", 1.5), ("min_p", -0.1), ("repeat_penalty", 0.0), ("repeat_penalty", -1.1),
       ("repeat_penalty", math.inf), ("repeat_last_n", -2), ("repeat_last_n", 1.5),
       ("frequency_penalty", 2.5), ("frequency_penalty", math.nan), ("presence_penalty", -3.0),
       ("max_new_tokens", 0), ("seed", 2**64), ("seed", 1.5), ("speculation", "fast"), ("draft_tokens", 40),
       ("temperature", "0.7"), ("top_p", True), ("top_k", None)]


@pytest.mark.parametrize("field,value", BAD)
def test_out_of_range_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field}={value!r} is out of range: expected"):
        GenerationParams(**{field: value}).validate()


def test_defaults_and_edges_are_valid():
    GenerationParams().validate()
    GenerationParams(temperature=0, top_p=1, top_k=0, min_p=0, repeat_penalty=10, repeat_last_n=-1,
                     frequency_penalty=-2, presence_penalty=2, seed=-5, draft_tokens=16).validate()


def test_checked_passes_a_valid_snapshot_through():
    live, previous = GenerationParams(temperature=1.1), GenerationParams()
    params, why = checked(live, previous)
    assert why is None and params == live and params is not live


def test_checked_keeps_the_previous_value_of_each_invalid_field_and_says_why():
    previous = GenerationParams(temperature=0.7, top_p=0.9, min_p=0.05)
    live = GenerationParams(temperature=1.2, top_p=0.0, min_p=1.5)  # temperature valid, the others not
    params, why = checked(live, previous)
    assert (params.temperature, params.top_p, params.min_p) == (1.2, 0.9, 0.05)
    params.validate()
    assert why == ("top_p=0.0 is out of range: expected a number in (0, 1] (1 = off); keeping the previous top_p=0.9; "
                   "min_p=1.5 is out of range: expected a number in [0, 1) (0 = off); keeping the previous min_p=0.05")
    assert (live.top_p, live.min_p) == (0.0, 1.5)  # the live object is the UI's: never written
