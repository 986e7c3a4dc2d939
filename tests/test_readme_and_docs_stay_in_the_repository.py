"""The README and docs/ describe this repository as it is: the two set-up commands are the Makefile's and CI's,
every declared dependency is named with its purpose, no page points outside the repository, and every path or
link they cite exists (a file moved without its docs fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
TOP_FOLDERS = ("app/", "bench/", "engine/", "models/", "kernels/", "assets/", "scripts/", "tests/", "docs/", ".ci/")


def _section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end != -1 else len(text)]


def test_the_readme_is_a_users_readme():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 350


def test_the_two_set_up_commands_are_the_makefiles_and_cis():
    setup = _section(README.read_text(encoding="utf-8"), "Set-up: two commands")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("chat", "test"):
        assert f"make {target}" in setup
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no `{target}` target"
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_every_declared_dependency_is_named_with_its_purpose():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        declared += extra
    names = {re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower() for d in declared}
    table = _section(README.read_text(encoding="utf-8"), "Dependencies and what each is for")
    named = {m.split("==")[0].lower() for row in table.splitlines() if row.startswith("| `")
             for m in re.findall(r"`([^`]+)`", row.split("|")[1])}
    missing = sorted(names - named)
    assert not missing, f"README's dependency table does not name {missing}: add each with what it is for"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_points_outside_the_repository(page: Path):
    assert "../shared" not in page.read_text(encoding="utf-8")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_cited_path_and_link_exists(page: Path):
    text = page.read_text(encoding="utf-8")
    missing = []
    for quoted in set(re.findall(r"`([^`\s]+)`", text)):
        path = quoted.split("::")[0].rstrip(",.")
        if path.startswith(TOP_FOLDERS) and not set("<*{") & set(path) and not (ROOT / path).exists():
            missing.append(path)
    for link in set(re.findall(r"\]\(([^)#\s]+)", text)):
        if not link.startswith(("http://", "https://")) and not (page.parent / link).exists():
            missing.append(link)
    assert not missing, f"{page.relative_to(ROOT)} cites what the repository does not hold: {sorted(missing)}"
