"""Every code block of docs/ marked ``<!-- runnable -->`` runs to completion on the Local
provider: one subprocess per page (its blocks in order), with the repository's .venv python."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.docs import PYTHON
from tests.docs.runnable import page_script, pages_with_snippets, snippets_of

PAGES = pages_with_snippets()


def test_runnable_blocks_exist_where_the_docs_promise_them() -> None:
    promised = {"getting-started.md", "guides/broadcast.md", "providers.md"}
    assert promised <= set(PAGES), sorted(PAGES)


def test_a_marker_without_a_python_fence_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable -->\n```bash\necho hi\n```\n")
    with pytest.raises(ValueError, match="must be followed by a ```python fence"):
        snippets_of(page)


@pytest.mark.integration
@pytest.mark.parametrize("page", sorted(PAGES))
def test_runnable_blocks_run(page: str, tmp_path: Path) -> None:
    script = tmp_path / "snippets.py"
    script.write_text(page_script(PAGES[page]))
    done = subprocess.run(
        [PYTHON, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**os.environ}, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"{page}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def test_a_marker_quoted_inside_a_fence_is_not_a_snippet(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("````markdown\n<!-- runnable -->\n```python\nx = 1\n```\n````\n\n"
                    "<!-- runnable -->\n```python\ny = 2\n```\n")
    assert [s.code for s in snippets_of(page)] == ["y = 2\n"]
