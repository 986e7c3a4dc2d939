"""`--quant gguf` on the CPU caches the native step's packed layout in the Parley cache, keyed by the file's
sha256: the next start packs nothing and computes bitwise the same logits; a file changed in place gets a
layout of its own (never the stale one, which is removed when the new one is saved); the folder holding the
user's file is never written to."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import gguf
import pytest
import torch
from tiny_models import reference_model, tiny_config, write_gguf

from parley.engine.engine import Engine
from parley.kernels import native
from parley.models import native_cache, native_forward
from parley.models.resolve import resolve

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")

IDS = list(range(5, 60))


def tiny_gguf(path, seed: int):
    config = tiny_config()  # untied: the file's own output.weight is packed to int8 rows
    config["intermediate_size"] = 128
    return write_gguf(path, reference_model(config, seed=seed), config, linears_as=gguf.GGMLQuantizationType.Q4_1)


def logits(path) -> torch.Tensor:
    engine = Engine.load(str(path), quant="gguf", device="cpu")
    assert engine.step_kind == "native"
    engine.reset_cache()
    return engine.forward(IDS)


def no_packing(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("packed again although the cached layout was valid")

    for name in ("pack_q4", "pack_q4_rows", "pack_q8"):
        monkeypatch.setattr(native, name, refuse)


def layouts(path) -> list[str]:
    native_cache.wait_for_saves()  # written on a thread (native_cache.save_later)
    return sorted(p.name for p in native_cache.gguf_place(resolve(str(path))).folder.glob("native-*"))


def test_second_start_reads_the_cached_layout_and_computes_the_same(tmp_path, monkeypatch):
    mine = tmp_path / "models"
    mine.mkdir()
    path = tiny_gguf(mine / "tiny.gguf", seed=3)
    want = logits(path)
    assert len(layouts(path)) == 2  # the packed tensors and their manifest
    with monkeypatch.context() as m:
        no_packing(m)
        assert torch.equal(logits(path), want)
    assert [p.name for p in mine.iterdir()] == ["tiny.gguf"], "wrote beside the user's file"


def test_a_file_changed_in_place_gets_its_own_layout(tmp_path, monkeypatch):
    path = tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    old = logits(path)
    stale = layouts(path)
    tiny_gguf(path, seed=4)  # other weights under the same name
    new = logits(path)
    assert not torch.allclose(new, old)
    assert torch.equal(new, logits(tiny_gguf(tmp_path / "fresh.gguf", seed=4)))
    assert len(layouts(path)) == 2 and not set(layouts(path)) & set(stale), "the stale layout was kept"
    with monkeypatch.context() as m:
        no_packing(m)
        assert torch.equal(logits(path), new)


def test_the_step_runs_while_its_layout_is_written_and_the_next_start_waits_for_it(tmp_path, monkeypatch):
    """The layout is written on a thread: a first start computes before the file exists, and a second start in
    the same process reads that file once written (released as it looks for it) instead of packing again."""
    path = tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    release, me = threading.Event(), threading.get_ident()
    real_save, real_key = native_cache.save_safetensors_atomic, native_cache.cache_key

    def held(*a, **k):
        if threading.get_ident() == me:
            raise AssertionError("the layout was written before the step ran")
        assert release.wait(timeout=600), "never released"
        return real_save(*a, **k)

    def releasing(*a, **k):
        release.set()  # the second start asks for the layout: the first one's write goes on now
        return real_key(*a, **k)

    monkeypatch.setattr(native_cache, "save_safetensors_atomic", held)
    try:
        want = logits(path)
        folder = native_cache.gguf_place(resolve(str(path))).folder
        assert not list(folder.glob("native-*")), "the layout was written before the step ran"
        with monkeypatch.context() as m:
            no_packing(m)
            m.setattr(native_cache, "cache_key", releasing)
            assert torch.equal(logits(path), want)
    finally:
        release.set()
    assert len(layouts(path)) == 2


def test_a_killed_writers_temporary_file_is_removed_by_the_next_save(tmp_path):
    path = tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    folder = native_cache.gguf_place(resolve(str(path))).folder
    folder.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = folder / f".native-0123.safetensors.pid{int(gone.stdout)}.89abcdef.tmp"
    alive = folder / f".native-4567.safetensors.pid{os.getpid()}.89abcdef.tmp"
    dead.write_bytes(b"half")
    alive.write_bytes(b"being written")
    logits(path)
    assert len(layouts(path)) == 2
    assert not dead.exists() and alive.exists()


def test_a_layout_still_being_written_when_the_process_ends_is_written_whole(tmp_path):
    """The write goes on while the interpreter shuts down (a reply shorter than the write): it must finish
    there, where a thread pool refuses new work."""
    path = tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    script = f"""
import threading, time
from parley.models import native_cache
from parley.engine.engine import Engine
real = native_cache.save_safetensors_atomic
def late(*a, **k):
    while threading.main_thread().is_alive():  # held until the main thread has returned
        time.sleep(0.01)
    return real(*a, **k)
native_cache.save_safetensors_atomic = late
engine = Engine.load({str(path)!r}, quant="gguf", device="cpu")
engine.reset_cache()
engine.forward({IDS!r})
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ.copy())
    assert done.returncode == 0 and "could not cache" not in done.stderr, done.stderr
    assert len(layouts(path)) == 2
    with pytest.MonkeyPatch.context() as m:
        no_packing(m)
        logits(path)


def test_a_cancelled_write_keeps_nothing(tmp_path, monkeypatch):
    """Ctrl-C at the end of a command gives the write up (native_cache.cancel_saves): no layout, no temporary
    file, and the next start packs again and caches it."""
    path = tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    real = native_cache.save_safetensors_atomic

    def held(*a, **k):
        assert native_cache._stop.wait(timeout=600), "never cancelled"
        return real(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(native_cache, "save_safetensors_atomic", held)
        want = logits(path)
        assert native_cache.pending_saves()
        native_cache.cancel_saves()
    folder = native_cache.gguf_place(resolve(str(path))).folder
    assert not native_cache.pending_saves() and not list(folder.iterdir())
    assert torch.equal(logits(path), want) and len(layouts(path)) == 2


def write_held_until_the_cli_waits(monkeypatch) -> threading.Event:
    """The layout's write waits until the command waits for it (so the command surely ends first); the returned
    event lets it go regardless, for a test that fails before."""
    release = threading.Event()
    real_save, real_wait = native_cache.save_safetensors_atomic, native_cache.wait_for_saves

    def held(*a, **k):
        assert release.wait(timeout=600), "never released"
        return real_save(*a, **k)

    def waiting() -> None:
        release.set()  # the command waits for the write now: let it go on
        real_wait()

    monkeypatch.setattr(native_cache, "save_safetensors_atomic", held)
    monkeypatch.setattr(native_cache, "wait_for_saves", waiting)
    return release


GENERATE = ["generate", "--quant", "gguf", "--temperature", "0", "--max-new-tokens", "2", "--raw", "hello"]


def test_the_cli_says_it_is_writing_the_layout_and_waits_for_it(tmp_path, monkeypatch, capsys):
    from parley.app.cli import main

    path = tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    release = write_held_until_the_cli_waits(monkeypatch)
    try:
        assert main([*GENERATE, "--model", str(path)]) == 0
    finally:
        release.set()
    assert "writing the CPU layout for the next start" in capsys.readouterr().err
    folder = native_cache.gguf_place(resolve(str(path))).folder
    assert sorted(p.suffix for p in folder.glob("native-*")) == [".json", ".safetensors"]


def test_a_command_ending_in_an_error_still_says_it_writes_the_layout_and_waits(tmp_path, monkeypatch, capsys):
    """An error after the step was built (bad input met mid-command) prints its one line, then the write is said
    and waited for as after a reply, not silently by the interpreter on its way out."""
    from parley.app import generate
    from parley.app.cli import main

    path = tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    real_run = generate.run

    def run_then_fail(args):
        real_run(args)
        assert native_cache.pending_saves(), "the write ended before the command did: nothing to wait for"
        raise ValueError("a problem met after the reply")

    monkeypatch.setattr(generate, "run", run_then_fail)
    release = write_held_until_the_cli_waits(monkeypatch)
    try:
        assert main([*GENERATE, "--model", str(path)]) == 2
    finally:
        release.set()
    err = capsys.readouterr().err
    assert "parley: error: a problem met after the reply" in err
    assert "writing the CPU layout for the next start" in err.split("a problem met after the reply", 1)[1]
    folder = native_cache.gguf_place(resolve(str(path))).folder
    assert sorted(p.suffix for p in folder.glob("native-*")) == [".json", ".safetensors"]


def test_ctrl_c_while_the_cli_waits_for_the_write_leaves_nothing(tmp_path):
    """Ctrl-C while `parley generate` says it is writing the layout: exit 130 at once, no layout and no
    temporary file (the interpreter must not exit under a write it believes ended)."""
    path = tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    script = f"""
import signal, sys
from parley.app.cli import main
from parley.models import native_cache
signal.signal(signal.SIGINT, signal.default_int_handler)  # even where the test runner's SIGINT is ignored
real = native_cache.save_safetensors_atomic
def held(*a, **k):
    assert native_cache._stop.wait(timeout=600), "never cancelled"
    return real(*a, **k)
native_cache.save_safetensors_atomic = held
sys.exit(main(["generate", "--model", {str(path)!r}, "--quant", "gguf", "--temperature", "0",
               "--max-new-tokens", "2", "--raw", "hello"]))
"""
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, env=os.environ.copy())
    said = ""
    while "writing the CPU layout" not in said:
        line = child.stderr.readline()
        assert line, f"ended without saying it writes the layout: {said}"
        said += line
    child.send_signal(signal.SIGINT)
    rest = child.stderr.read()
    assert child.wait(timeout=600) == 130, said + rest
    assert "interrupted" in rest, rest
    folder = native_cache.gguf_place(resolve(str(path))).folder
    assert not list(folder.iterdir()), "a layout or a temporary file was left"
