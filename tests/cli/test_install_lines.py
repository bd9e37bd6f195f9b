"""Every install line the README and docs/ print works as written: no placeholders, local
paths that exist with extras pyproject.toml defines, and never a package name that is not on
an index (mlxd itself is installed from this repository, not from PyPI)."""

import re
import shlex
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PIP_INSTALL = re.compile(r"\bpip3? install\b(.*)")
PLACEHOLDER = re.compile(r"<[A-Za-z][^<>]*>")  # `<this repository's URL>`, `<path>`
# pip options that take a value (the value is not a requirement); -e's value is one.
VALUED = {"-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "-t", "--target"}


def _install_lines(page: Path) -> list[str]:
    """Each `pip install` command's arguments: continuations joined, cut at the end of the
    command (a backtick closing inline code, `&&`, `;`, a comment)."""
    text = page.read_text().replace("\\\n", " ")
    found = []
    for match in PIP_INSTALL.finditer(text):
        rest = re.split(r"`|&&|;|\s#|\|", match.group(1))[0]
        found.append(rest.strip())
    return found


def _targets(args: str) -> list[str]:
    words, targets, skip = shlex.split(args), [], False
    for word in words:
        if skip:
            skip = False
        elif word in VALUED:
            skip = True
        elif not word.startswith("-"):
            targets.append(word)
    return targets


def _check(target: str, extras_defined: set[str]) -> str | None:
    """Why `target` would fail as written, or None."""
    if target.startswith((".", "/", "~")):
        path, _, extras = target.partition("[")
        if not (ROOT / path / "pyproject.toml").is_file():
            return f"{path}: not this repository's folder (docs run from its root)"
        unknown = {e.strip() for e in extras.rstrip("]").split(",") if e.strip()}
        unknown -= extras_defined
        return f"extras {sorted(unknown)} are not in pyproject.toml" if unknown else None
    if Requirement(target).name.lower() == "mlxd":
        return "mlxd is not on PyPI: install it from this repository's folder"
    return None


def test_the_pages_print_install_lines() -> None:
    """The scan below finds what it checks (the README's own install block)."""
    targets = [t for line in _install_lines(ROOT / "README.md") for t in _targets(line)]
    assert "." in targets and ".[cuda]" in targets


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_install_line_works_as_written(page: Path) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = set(pyproject["project"]["optional-dependencies"])
    lines = _install_lines(page) + re.findall(r"git clone[^\n`]*", page.read_text())
    placeholders = [line for line in lines if PLACEHOLDER.search(line)]
    assert not placeholders, f"{page.name}: placeholders in {placeholders}"
    problems = {
        target: why
        for line in _install_lines(page)
        for target in _targets(line)
        if (why := _check(target, extras))
    }
    assert not problems, f"{page.name}: {problems}"
