"""Through the commands a user types: `parley quantize` writes the rotated down_proj file beside the standard
folder and lists it in the manifest; `parley generate` on a copy of that folder whose rotated file is damaged
fails with one line naming the file, and with PARLEY_DOWN_HADAMARD=0 (the standard down_proj, the file never
opened) answers as before."""

import json
import shutil
from pathlib import Path

from awq_tiny import outlier_model, write_hf_dir

from parley.app.cli import main
from parley.models import native_cache
from parley.models.quantize import hadamard


def test_quantize_writes_it_and_generate_honours_the_switch(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = write_hf_dir(outlier_model(dim=128, intermediate=256), tmp_path / "tiny")
    argv = ["quantize", str(src), "--group-size", "64", "--calib", "builtin", "--samples", "4", "--seq-len", "32"]
    assert main(argv) == 0
    folder = Path(capsys.readouterr().out.strip().splitlines()[-1])
    listed = json.loads((folder / "manifest.json").read_text())["files"]
    assert hadamard.FILE in listed and listed[hadamard.FILE]["size"] == (folder / hadamard.FILE).stat().st_size

    mine = tmp_path / "my-awq"  # a user's copy, outside the cache: nothing verifies it before loading
    native_cache.wait_for_saves()
    shutil.copytree(folder, mine, ignore=shutil.ignore_patterns("native-*"))
    data = (mine / hadamard.FILE).read_bytes()
    (mine / hadamard.FILE).write_bytes(data[: len(data) // 2])
    gen = ["generate", "--model", str(mine), "--quant", "none", "--temperature", "0", "--max-new-tokens", "4",
           "--raw", "hello"]
    assert main(gen) == 2  # a model that cannot be loaded
    err = capsys.readouterr().err.strip()
    assert hadamard.FILE in err and "parley quantize --rebuild" in err and "Traceback" not in err, err
    monkeypatch.setenv(hadamard.DISABLE_ENV, "0")
    assert main(gen) == 0
