"""`parley quantize` writes the AWQ folder into the Parley cache, prints the time taken, and prints the
folder as its last line; a second run finds it in the cache."""

import json
from pathlib import Path

from awq_tiny import outlier_model, write_hf_dir

from parley.app.cli import main
from parley.models.quantize.cache import awq_root


def test_quantize_prints_cache_folder_last(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = write_hf_dir(outlier_model(dim=96, intermediate=192), tmp_path / "tiny")
    argv = ["quantize", str(src), "--group-size", "128", "--calib", "builtin", "--samples", "4", "--seq-len", "32"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    folder = Path(lines[-1])
    assert folder.parent == awq_root() and (folder / "manifest.json").is_file()
    assert any("quantization took" in line for line in lines)
    assert any("32 is used for all layers" in line for line in lines)  # 96 is not a multiple of 128 or 64

    manifest = folder / "manifest.json"
    built = (manifest.read_text(), manifest.stat().st_ino, manifest.stat().st_mtime_ns)
    assert main(argv) == 0
    again = capsys.readouterr().out.strip().splitlines()
    assert again[-1] == str(folder)
    # the second run used the cached folder: a silent rebuild would write a new manifest
    assert (manifest.read_text(), manifest.stat().st_ino, manifest.stat().st_mtime_ns) == built
    created = json.loads(built[0])["created"]
    assert any(f"when built {created}" in line for line in again)
