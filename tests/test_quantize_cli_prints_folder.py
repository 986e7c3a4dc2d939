"""`parley quantize` writes the AWQ folder into the Parley cache, prints the time taken, and prints the
folder as its last line; a second run finds it in the cache."""

from pathlib import Path

from awq_tiny import outlier_model, write_hf_dir

from parley.app.cli import main
from parley.models.quantize.cache import cache_root


def test_quantize_prints_cache_folder_last(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = write_hf_dir(outlier_model(dim=96, intermediate=192), tmp_path / "tiny")
    argv = ["quantize", str(src), "--group-size", "128", "--calib", "builtin", "--samples", "4", "--seq-len", "32"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    folder = Path(lines[-1])
    assert folder.parent == cache_root() and (folder / "manifest.json").is_file()
    assert any("quantization took" in line for line in lines)
    assert any("32 is used for all layers" in line for line in lines)  # 96 is not a multiple of 128 or 64

    assert main(argv) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(folder)
