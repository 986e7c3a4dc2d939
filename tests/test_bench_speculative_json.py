"""`parley bench speculative --json` prints one JSON object with every scenario's figures (run here on
the tiny model, so it checks the plumbing, not the speed)."""

import argparse
import json

import pytest
from single_thread import single_thread  # noqa: F401
from tiny import tiny_engine

from parley.bench import speculative as bench_speculative
from parley.engine.engine import Engine


def test_json_has_every_scenario(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **kw: tiny_engine(seed=3)))
    monkeypatch.setattr(bench_speculative, "document", lambda: "alpha beta gamma. " * 8)
    p = argparse.ArgumentParser()
    bench_speculative.add_arguments(p)
    public = tmp_path / "licence.txt"
    public.write_text("Permission is granted to copy this text. " * 6)
    args = p.parse_args(["--json", "--draft", "self:1", "--new-tokens", "12", "--draft-tokens", "4",
                         "--public-document", str(public), "--peer", "none"])
    assert bench_speculative.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("summarise", "summarise_public", "free_chat"):
        assert set(out[key]) == {"plain", "prompt_lookup", "suffix", "suffix_tree", "auto", "draft self:1"}
        for r in out[key].values():
            assert {"tok_s", "acceptance", "tokens_per_pass", "new_tokens", "drafter", "note"} <= set(r)
        assert "vs_plain" in out[key]["suffix"] and out[key]["plain"]["drafter"] == ""
    assert out["public_document"] == str(public) and out["prompt_tokens"]["summarise_public"] > 240
    for figures in out["target_cost_by_tokens"].values():
        assert set(figures) == {"1", "2", "3", "5", "9", "17"}
    assert out["peak_rss_mb"] > 0 and out["drafts"] == ["self:1"]


def test_human_readable_output(monkeypatch, capsys):
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **kw: tiny_engine(seed=3)))
    monkeypatch.setattr(bench_speculative, "document", lambda: "alpha beta gamma. " * 8)
    p = argparse.ArgumentParser()
    bench_speculative.add_arguments(p)
    args = p.parse_args(["--new-tokens", "8", "--public-document", "none", "--peer", "none"])
    assert bench_speculative.run(args) == 0
    text = capsys.readouterr().out
    assert "(a) summarise" in text and "(b) free chat" in text and "(a2)" not in text
    assert "prompt_lookup" in text and "suffix" in text and "peak RSS" in text


def test_unreadable_public_document_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **kw: tiny_engine(seed=3)))
    p = argparse.ArgumentParser()
    bench_speculative.add_arguments(p)
    missing = tmp_path / "nope.txt"
    with pytest.raises(SystemExit, match=f"--public-document {missing}: cannot read it"):
        bench_speculative.run(p.parse_args(["--public-document", str(missing), "--peer", "none"]))


def test_documents_suite_json_per_document_median_and_worst(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **kw: tiny_engine(seed=3)))
    (tmp_path / "a.txt").write_text("The quick brown fox jumps over the lazy dog.\n" * 40)
    (tmp_path / "b.txt").write_text("Permission is granted to copy this text.\n" * 30)
    p = argparse.ArgumentParser()
    bench_speculative.add_arguments(p)
    args = p.parse_args(["--json", "--documents", str(tmp_path), "--prompt-budget", "300", "--new-tokens", "8",
                         "--draft-tokens", "4", "--peer", "none"])
    assert bench_speculative.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["documents"]) == ["a.txt", "b.txt", "free chat"]
    for doc in out["documents"].values():
        assert doc["prompt_tokens"] <= 300 + 60  # cut to the budget (plus the prompt and the chat template)
        assert set(doc["modes"]) == {"plain", "prompt_lookup", "suffix", "suffix_tree", "auto"}
        assert {"vs_plain", "tokens_per_pass", "vs_best_fixed", "vs_best_fixed_held_out"} <= set(doc["modes"]["auto"])
        assert all(len(r["tok_s_runs"]) == 1 for r in doc["modes"].values())
    for label in ("median", "worst"):
        assert {"tok_s", "vs_plain", "tokens_per_pass"} <= set(out["summary"][label]["suffix"])
        assert "vs_best_fixed_held_out" in out["summary"][label]["auto"]
    # and as a table: a row per prompt, then the median and the worst
    args = p.parse_args(["--documents", str(tmp_path), "--prompt-budget", "300", "--new-tokens", "8", "--peer", "none"])
    assert bench_speculative.run(args) == 0
    text = capsys.readouterr().out
    assert "a.txt" in text and "free chat" in text and "median (documents)" in text and "worst (documents)" in text


def test_default_documents_are_at_least_eight_debian_texts():
    from parley.bench import documents

    docs, notes = documents.suite()
    assert len(documents.SUITE) >= 8 and len(docs) + len(notes) == len(documents.SUITE)
    assert all(len(text) > 2000 for _, text in docs), [(n, len(t)) for n, t in docs]


def test_a_documents_path_that_is_no_folder_is_one_line(tmp_path):
    from parley.bench import documents

    with pytest.raises(SystemExit, match="not a folder"):
        documents.folder(str(tmp_path / "nope"))


def test_modelled_figures_follow_the_given_cost_and_repeat_exactly(monkeypatch, capsys, tmp_path):
    """`--modelled PER_ROW`: the engine decides how many guesses to verify on the given cost, not the clock, so
    two runs give the same modelled figures; rows priced at nothing verify every guess suffix match makes, rows
    priced at 100 passes verify one at most (alone a reply verifies at least one, to go on measuring)."""
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **kw: tiny_engine(seed=3)))
    (tmp_path / "a.txt").write_text("The quick brown fox jumps over the lazy dog.\n" * 40)
    p = argparse.ArgumentParser()
    bench_speculative.add_arguments(p)

    def run(per_row: str) -> dict:
        args = p.parse_args(["--json", "--documents", str(tmp_path), "--prompt-budget", "300", "--new-tokens", "16",
                             "--draft-tokens", "8", "--peer", "none", "--modelled", per_row])
        assert bench_speculative.run(args) == 0
        return json.loads(capsys.readouterr().out)

    first, again = run("0.2"), run("0.2")
    for name, doc in first["documents"].items():
        for mode, r in doc["modes"].items():
            assert r["modelled_vs_plain"] == again["documents"][name]["modes"][mode]["modelled_vs_plain"], (name, mode)
        assert doc["modes"]["plain"]["modelled_vs_plain"] == 1.0
        assert "modelled_vs_best_fixed" in doc["modes"]["auto"]
    assert "modelled_vs_best_fixed" in first["summary"]["median"]["auto"]
    free, dear = run("0"), run("100")
    suffix_free = free["documents"]["a.txt"]["modes"]["suffix"]
    suffix_dear = dear["documents"]["a.txt"]["modes"]["suffix"]
    passes = round(suffix_dear["new_tokens"] / suffix_dear["tokens_per_pass"])
    assert suffix_dear["proposed"] <= passes
    assert suffix_free["proposed"] > suffix_dear["proposed"]


def test_modelled_through_the_command_a_user_types(monkeypatch, capsys, tmp_path):
    """`parley bench speculative --documents DIR --modelled 0.2 --json`, through the CLI's own parser."""
    from parley.app import cli

    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **kw: tiny_engine(seed=3)))
    (tmp_path / "a.txt").write_text("The quick brown fox jumps over the lazy dog.\n" * 40)
    assert cli.main(["bench", "speculative", "--documents", str(tmp_path), "--prompt-budget", "300",
                     "--new-tokens", "8", "--draft-tokens", "4", "--peer", "none", "--modelled", "0.2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["documents"]["a.txt"]["modes"]["plain"]["modelled_vs_plain"] == 1.0
    assert "modelled_vs_best_fixed" in out["summary"]["median"]["auto"]
