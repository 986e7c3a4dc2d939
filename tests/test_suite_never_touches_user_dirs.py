"""The suite never reads or writes the user's real Parley directories, module-scoped fixtures included (they
run before any function-scoped fixture: one that builds the INT4 model used to write into ~/.cache/parley)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from parley.cache_files import cache_root

VARIABLES = ("PARLEY_DATA_DIR", "PARLEY_CACHE_DIR", "PARLEY_CONFIG_DIR")


@pytest.fixture(scope="module")
def seen_by_a_module_fixture(tmp_path_factory) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in VARIABLES} | {"base": str(tmp_path_factory.getbasetemp())}


def test_module_fixtures_see_the_isolated_dirs(seen_by_a_module_fixture):
    base = Path(seen_by_a_module_fixture["base"])
    for name in VARIABLES:
        value = seen_by_a_module_fixture[name]
        assert value is not None and Path(value).is_relative_to(base.parent), f"{name}={value!r} outside {base.parent}"


def test_the_cache_the_code_uses_is_the_isolated_one(tmp_path_factory):
    assert cache_root().is_relative_to(tmp_path_factory.getbasetemp())
