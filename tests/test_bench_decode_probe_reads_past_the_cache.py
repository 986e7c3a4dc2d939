"""`bench decode`'s bandwidth probe reads a buffer 32 times the largest cache (1 to 4 GB): an AMD L3 keeps part
of a buffer swept again and again, so a probe of a few times the L3 reads partly from it and sets a decode step,
whose gigabytes of weights never come back to the cache, beside bandwidth it never gets."""

from pathlib import Path

from parley.bench.decode import probe_mb


def caches(tmp_path: Path, sizes: list[str]) -> str:
    for i, size in enumerate(sizes):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    return str(tmp_path)


def test_32_times_the_largest_cache(tmp_path):
    assert probe_mb(caches(tmp_path, ["48K", "32K", "1024K", "65536K"])) == 2048  # a 64 MB L3


def test_at_least_1_gb(tmp_path):
    assert probe_mb(caches(tmp_path, ["32K", "512K", "8M"])) == 1024
    assert probe_mb(str(tmp_path / "no-such-folder")) == 1024  # no cache sizes known


def test_at_most_4_gb(tmp_path):
    assert probe_mb(caches(tmp_path, ["256M"])) == 4096


def test_an_unreadable_size_is_skipped(tmp_path):
    assert probe_mb(caches(tmp_path, ["banana", "49152K"])) == 1536
