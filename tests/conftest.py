import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # test helpers (tiny.py, fakehub.py) import as modules

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    """No test reads or writes the user's real Parley cache or data."""
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("PARLEY_DATA_DIR", str(base / "parley-data"))
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(base / "parley-cache"))
    monkeypatch.setenv("PARLEY_CONFIG_DIR", str(base / "parley-config"))
