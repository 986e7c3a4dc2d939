import os
import sys
from pathlib import Path

# `make test` runs the suite in pytest-xdist workers, one per core (up to 4), each on one thread: tests
# are mostly small ops, and threads that meet at a barrier every op wait for whichever one is descheduled
# on a busy machine. Set before torch (and the native step's OpenMP) start. Tests of threaded code set
# their own counts.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("PARLEY_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from parley.models import native_cache  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # test helpers (tiny.py, fakehub.py) import as modules

torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, torch.get_num_threads())))


def _set_dirs(mp: pytest.MonkeyPatch, root) -> None:
    mp.setenv("PARLEY_DATA_DIR", str(root / "parley-data"))
    mp.setenv("PARLEY_CACHE_DIR", str(root / "parley-cache"))
    mp.setenv("PARLEY_CONFIG_DIR", str(root / "parley-config"))


@pytest.fixture(autouse=True, scope="session")
def _isolated_dirs_for_fixtures(tmp_path_factory):
    """Module-scoped fixtures (the INT4 model's, say) run before any function-scoped one: they get dirs of their
    own, so that they never write into the user's ~/.cache/parley. One for all of a run's xdist workers (the
    parent of their base temps), as the user's cache was: the real model is quantized once, not per worker."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with pytest.MonkeyPatch.context() as mp:
        _set_dirs(mp, shared / "fixtures")
        mp.setenv("PARLEY_TEST_SHARED_CACHE", str(shared / "fixtures" / "parley-cache"))  # real_engines.int4_path
        yield


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    """No test reads or writes the user's real Parley cache or data (tests that count the cache's folders see
    only what tests wrote, not what a module's fixture built)."""
    _set_dirs(monkeypatch, tmp_path_factory.getbasetemp())
    yield
    native_cache.wait_for_saves()  # a layout written on a thread lands in this test's folders, not the next's


# The longest files (measured, --durations) start first: `--dist loadfile` hands files to workers in
# collection order, and a long file collected last keeps one worker busy while the other idles. The first builds
# the test INT4 model (~110 s of one core, once a run: real_engines.int4_path); the next three need none, so the
# other worker runs them meanwhile instead of waiting for that build; then the rest of the INT4 files, then the
# rest by length.
LONGEST_FIRST = [
    "test_batch_invariance_real_model.py", "test_triton_int4_matches_reference.py",
    "test_gemma3_gguf_greedy_matches_transformers.py", "test_native_portable_loops.py",
    "test_speculative_greedy_identity_real_model.py", "test_batched_replies_equal_solo_replies.py",
    "test_cancel_real_model_next_reply_equals_fresh.py", "test_prefix_reuse_real_model_equals_fresh.py",
    "test_kv_cache_flag_reaches_the_reply.py", "test_speculative_output_law.py",
    "test_gemma3_tokenizer_matches_transformers.py", "test_gguf_greedy_matches_transformers.py",
    "test_speculative_distribution_is_target.py", "test_gguf_tokenizer_cache.py",
    "test_remote_reads_are_bounded.py", "test_generate_cli_suffix_tree_equals_plain.py",
    "test_remote_hostile_servers.py", "test_quant_cache_atomic.py", "test_native_profile_build.py",
    "test_gpu_check_dry.py", "test_bench_serve_json.py", "test_bench_faults_cancel_check.py", "test_sass_budget.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def _one_gguf_reader_per_file() -> None:
    """transformers reads a GGUF twice to load one (its config, then its tensors), and gguf-py's reader makes a
    numpy view per array element: 14 s a read for Gemma 3's 262k-token vocabulary on one core. The references
    that load a GGUF through transformers share the latest file's reader instead (the file is only read); what
    they compute is unchanged."""
    try:
        import gguf
    except ImportError:
        return
    make = gguf.GGUFReader
    latest: dict[tuple, object] = {}

    def reader(path, mode="r"):
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, mode)
        if key not in latest:
            latest.clear()  # one file's reader at a time: a vocabulary's views take hundreds of MB
            latest[key] = make(path, mode)
        return latest[key]

    gguf.GGUFReader = reader


_one_gguf_reader_per_file()
