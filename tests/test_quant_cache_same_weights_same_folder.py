"""A model is identified by what it is, not by how it was named: the embedded model picked in F5 (by its path),
the same folder reached through a symlink, or a hub id shown under another name all find the INT4 folder the
first run built, and a second load waiting behind this process's own build says that is what it waits for."""

import threading

from awq_tiny import outlier_model, write_hf_dir

from parley.models.quantize import cache
from parley.models.resolve import ModelFiles, resolve

SMALL = {"group_size": 32, "calib": "builtin", "n_samples": 2, "seq_len": 16, "device": "cpu"}


def test_every_route_to_the_same_weights_finds_one_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    source = resolve(str(write_hf_dir(outlier_model(), tmp_path / "tiny")))
    (tmp_path / "link").symlink_to(tmp_path / "tiny")
    built = []
    monkeypatch.setattr(cache, "build", lambda files, key, folder, *a: built.append(folder))
    routes = [ModelFiles(ref="tiny (embedded)", kind="dir", path=source.path),  # the first run's name
              source,  # the path typed in the picker
              ModelFiles(ref=str(tmp_path / "link"), kind="dir", path=tmp_path / "link")]
    folders = {cache.ensure_quantized(files, **SMALL).path for files in routes}
    assert len(folders) == 1, folders
    hub = [ModelFiles(ref=ref, kind="dir", path=source.path, repo_id="org/tiny", revision="abc123")
           for ref in ("org/tiny", "org/tiny@abc123", "tiny, as the picker lists it")]
    assert len({cache.ensure_quantized(files, **SMALL).path for files in hub}) == 1


def test_waiting_behind_our_own_build_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    files = resolve(str(write_hf_dir(outlier_model(), tmp_path / "tiny")))
    started, release = threading.Event(), threading.Event()

    def slow_build(files, key, folder, *args):
        started.set()
        assert release.wait(120), "the test never released the first build"

    monkeypatch.setattr(cache, "build", slow_build)
    first = threading.Thread(target=lambda: cache.ensure_quantized(files, **SMALL))
    first.start()
    assert started.wait(120)
    said = []

    def progress(p):
        said.append(p.detail)
        release.set()

    cache.ensure_quantized(files, **{**SMALL, "group_size": 16}, progress=progress)
    first.join(120)
    waits = [s for s in said if "waiting" in s]
    assert waits == ["waiting for this Parley's INT4 build of tiny to finish"], said
