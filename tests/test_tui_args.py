"""`parley chat` flags reach the app: model, quantization, the sliders' starting values, the system prompt."""

from __future__ import annotations

import pytest

from parley.app import cli, tui
from parley.app.chat_app import ParleyApp


def test_chat_flags_build_the_app(monkeypatch):
    pytest.importorskip("parley.engine.engine")
    seen = {}

    def fake_run(self, *a, **k):
        seen.update(app=self)

    monkeypatch.setattr(ParleyApp, "run", fake_run)
    args = cli.build_parser().parse_args(
        ["chat", "--model", "org/m", "--quant", "none", "--temperature", "0.3", "--speculation", "off",
         "--system", "Be brief."]
    )
    assert args.module is tui
    assert tui.run(args) == 0
    app = seen["app"]
    assert app.model_ref == "org/m" and app.system_prompt == "Be brief."
    assert (app.params.temperature, app.params.speculation) == (0.3, "off")
    assert app.engines._load_engine.__self__.quant == "none"  # --quant reaches the loader
