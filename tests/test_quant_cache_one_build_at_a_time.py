"""Two loads of the same model starting at once (two Parleys on a first run, two test workers) quantize
it once: the second waits for the first's build lock, says so, then uses the folder the first wrote."""

import threading

from awq_tiny import outlier_model, write_hf_dir

from parley.models.quantize import cache
from parley.models.resolve import resolve

SMALL = {"calib": "builtin", "n_samples": 2, "seq_len": 32}


def test_a_second_load_waits_for_the_first_build(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    files = resolve(str(write_hf_dir(outlier_model(dim=64, intermediate=128), tmp_path / "tiny")))
    started, release, waiting = threading.Event(), threading.Event(), threading.Event()
    builds, results = [], {}
    real_build = cache.build

    def slow_build(*args, **kwargs):
        builds.append(threading.current_thread().name)
        started.set()
        assert release.wait(120), "the test never released the first build"
        real_build(*args, **kwargs)

    monkeypatch.setattr(cache, "build", slow_build)

    def load(name: str) -> None:
        def progress(p) -> None:
            if "waiting" in p.detail:
                waiting.set()
        results[name] = cache.ensure_quantized(files, group_size=64, progress=progress, **SMALL).path

    first = threading.Thread(target=load, args=("first",), name="first")
    first.start()
    assert started.wait(120)
    second = threading.Thread(target=load, args=("second",), name="second")
    second.start()
    assert waiting.wait(120), "the second load did not wait for the first build"
    release.set()
    first.join(120)
    second.join(120)
    assert builds == ["first"], builds
    assert results["first"] == results["second"] and (results["first"] / "manifest.json").is_file()
