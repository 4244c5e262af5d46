"""Find the code blocks of docs/ marked runnable: ``<!-- runnable -->`` on the line before a
```` ```python ```` fence (documented in docs/contributing.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.docs import ROOT

DOCS = ROOT / "docs"
MARKER = "<!-- runnable -->"
_FENCE_OPEN = re.compile(r"^```python\s*$")
_FENCE = re.compile(r"^\s*(`{3,})")


@dataclass(frozen=True)
class Snippet:
    """One runnable block: its page, the line its code starts on, and the code."""

    page: Path
    line: int
    code: str


def snippets_of(page: Path) -> list[Snippet]:
    """The runnable blocks of one page, in order; a marker not followed by a python fence is
    an error, so a marker cannot silently stop being tested."""
    lines = page.read_text().splitlines()
    found = []
    for index in _lines_outside_fences(lines):
        if lines[index].strip() != MARKER:
            continue
        if index + 1 >= len(lines) or not _FENCE_OPEN.match(lines[index + 1]):
            raise ValueError(f"{page}:{index + 1}: {MARKER} must be followed by a ```python fence")
        end = next((i for i in range(index + 2, len(lines)) if lines[i].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{page}:{index + 2}: the runnable block is never closed")
        found.append(Snippet(page, index + 3, "\n".join(lines[index + 2:end]) + "\n"))
    return found


def _lines_outside_fences(lines: list[str]) -> list[int]:
    """Indexes of the lines not inside a fenced block, so a marker quoted in an example (as
    in docs/contributing.md, inside a markdown fence of four backticks) is not taken for one."""
    outside, fence = [], ""
    for index, line in enumerate(lines):
        ticks = _FENCE.match(line)
        if fence:
            if ticks and ticks.group(1).startswith(fence) and not line.strip(" `"):
                fence = ""
        elif ticks:
            fence = ticks.group(1)
        else:
            outside.append(index)
    return outside


def pages_with_snippets() -> dict[str, list[Snippet]]:
    """Every page of docs/ that has runnable blocks, keyed by its path relative to docs/."""
    pages = {}
    for page in sorted(DOCS.rglob("*.md")):
        if found := snippets_of(page):
            pages[str(page.relative_to(DOCS))] = found
    return pages


def page_script(snippets: list[Snippet]) -> str:
    """One script for a page: its blocks in order, so later blocks see earlier definitions.
    Each block is preceded by a comment naming where it comes from, for tracebacks."""
    parts = [f"# --- {s.page.name}, line {s.line}\n{s.code}" for s in snippets]
    return "\n".join(parts)
