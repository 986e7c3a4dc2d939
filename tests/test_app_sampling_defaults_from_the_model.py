"""A model starts on the sampling values its makers recommend (generation_config.json, the GGUF's
`general.sampling.*`, or its family's card), the panel says where they come from, and the user's own values
win once set (a slider, a flag, a settings file from before); F8 goes back to the model's. The embedded
SmolLM2-135M at the old 0.7 answered nonsense; its card uses temperature 0.2, top-p 0.9."""

from __future__ import annotations

import json

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app import cli
from parley.app.settings import Settings
from parley.engine.params import GenerationParams
from parley.models.resolve import ModelFiles, resolve
from parley.models.sampling_defaults import sampling_defaults

pytestmark = pytest.mark.anyio

SMOL = ({"temperature": 0.2, "top_p": 0.9}, "from SmolLM2's model card")


def smol_engine(**kwargs) -> FakeEngine:
    engine = FakeEngine(**kwargs)
    engine.sampling_defaults = SMOL
    return engine


def recommended(app) -> str:
    return str(app.query_one("#recommended").render())


async def test_the_model_recommends_and_the_user_decides(tmp_path):
    engine = smol_engine(replies=["Paris."])
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await wait_until(lambda: app.params.temperature == 0.2)
        assert app.params.top_p == 0.9
        await pilot.press("f2")
        assert recommended(app) == "temperature 0.2 · top-p 0.9 · from SmolLM2's model card"
        await pilot.press("right", "right")  # the temperature slider: 0.20 -> 0.30
        await send(app, pilot, "Capital of France?")
        await wait_until(lambda: engine.calls and not app.generating)
        assert {(s.temperature, s.top_p) for s in engine.calls[0].snapshots} == {(0.3, 0.9)}
        assert recommended(app) == "top-p 0.9 · from SmolLM2's model card"  # temperature is the user's now

    again = smol_engine()  # the next start: the user's temperature stays, the model's top-p too
    app, _ = make_app(tmp_path, again, settings=Settings(tmp_path / "settings.json"))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await wait_until(lambda: app.params.top_p == 0.9)
        assert app.params.temperature == 0.3
        await pilot.press("f8")  # back to the defaults: the model's
        await wait_until(lambda: app.params.temperature == 0.2)
        assert Settings(tmp_path / "settings.json").chosen_params() == set()


async def test_a_flag_wins_and_a_model_without_a_word_keeps_the_engines_defaults(tmp_path):
    app, _ = make_app(tmp_path, smol_engine(), chosen_params=frozenset({"temperature"}),
                      params=GenerationParams(temperature=1.1))  # as `parley --temperature 1.1` starts it
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await wait_until(lambda: app.params.top_p == 0.9)
        assert app.params.temperature == 1.1
    app, _ = make_app(tmp_path / "other", FakeEngine())
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        assert app.params.temperature == 0.7 and not app.query_one("#recommended").display


def test_a_settings_file_from_before_keeps_only_what_differs_from_the_defaults(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"params": {"temperature": 0.7, "top_p": 0.5, "max_new_tokens": 512}}))
    assert Settings(path).chosen_params() == {"top_p"}


def test_where_the_values_come_from(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6,
                                                               "top_p": 0.9, "top_k": "many"}))
    files = ModelFiles(ref="org/smollm2-fork", kind="dir", path=folder)
    assert sampling_defaults(files) == ({"temperature": 0.6, "top_p": 0.9},
                                        "from the model's generation_config.json")
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 99}))  # untrusted: out of range
    assert sampling_defaults(files) == SMOL  # the name says SmolLM2
    assert sampling_defaults(ModelFiles(ref="x", kind="dir", path=folder)) == ({}, "")
    assert sampling_defaults(resolve(None)) == SMOL  # the embedded GGUF


def test_a_gguf_that_says_wins_over_the_family(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "smollm2-custom.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_float32("general.sampling.temp", 0.4)
    writer.add_int32("general.sampling.top_k", 40)
    writer.add_uint32("llama.context_length", 2048)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert sampling_defaults(ModelFiles(ref=str(path), kind="gguf", path=path)) == (
        {"temperature": pytest.approx(0.4), "top_k": 40}, "from the GGUF's metadata")


def test_parley_generate_uses_the_models_values_unless_a_flag_says(monkeypatch, capsys):
    from parley.engine.engine import Engine
    from parley.engine.events import Done, TextDelta

    seen = []

    class Recording(FakeEngine):
        sampling_defaults = SMOL

        def session(self, system_prompt=None):
            class Session:
                def reply(self, messages, params, cancel=None):
                    seen.append((params.temperature, params.top_p))
                    yield from (TextDelta("Paris."), Done("eos"))
            return Session()

    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **k: Recording()))
    assert cli.main(["generate", "Capital of France?"]) == 0
    assert cli.main(["generate", "Capital of France?", "--temperature", "0.9"]) == 0
    assert seen == [(0.2, 0.9), (0.9, 0.9)]
