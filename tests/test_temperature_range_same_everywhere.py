"""One temperature range for the command line, the API and the panel (0 to 2, OpenAI's), checked in one place:
it used to be 0-10 on the command line and 0-2 in the API."""

from __future__ import annotations

import pytest

from parley.app import cli
from parley.app.server.api import RequestError, parse_request
from parley.app.widgets.params_panel import SLIDERS
from parley.engine.params import TEMPERATURE_MAX


class Tokenizer:
    def encode_chat(self, messages):
        return [1, 2, 3]


class Served:
    model_name = "m"
    context_window = 4096
    tokenizer = Tokenizer()


def command_line(value: float):
    return cli.params_from_args(cli.build_parser().parse_args(["generate", "--temperature", str(value), "hi"]))


def api(value: float):
    return parse_request({"messages": [{"role": "user", "content": "hi"}], "temperature": value}, Served(), True)


def test_the_highest_temperature_is_taken_everywhere():
    assert TEMPERATURE_MAX == 2.0
    assert command_line(TEMPERATURE_MAX).temperature == TEMPERATURE_MAX
    assert api(TEMPERATURE_MAX).params.temperature == TEMPERATURE_MAX
    assert next(s for s in SLIDERS if s.attr == "temperature").maximum == TEMPERATURE_MAX


def test_above_it_is_refused_everywhere():
    with pytest.raises(ValueError, match="between 0 and 2"):
        command_line(2.5)
    with pytest.raises(RequestError, match="between 0 and 2"):
        api(2.5)
