"""No module of skyward_iac is over ``LIMIT`` lines (issue 31): past it, a module holds more than
one responsibility and is split along them. Nothing is excluded."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "skyward_iac"
LIMIT = 400


def _lines(path: str) -> int:
    return len((PACKAGE.parent / path).read_text().splitlines())


def test_no_module_is_over_the_limit() -> None:
    paths = [p.relative_to(PACKAGE.parent).as_posix() for p in sorted(PACKAGE.rglob("*.py"))]
    assert len(paths) > 100  # the package was found
    over = {path: lines for path in paths if (lines := _lines(path)) > LIMIT}
    assert not over, f"modules over {LIMIT} lines (split them along their responsibilities): {over}"

