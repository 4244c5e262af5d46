"""Tests of the documentation site: the strict mkdocs build and the runnable code blocks."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
#: The repository's own interpreter (the .venv scripts/setup makes), else the running one.
PYTHON = str(_VENV_PYTHON) if _VENV_PYTHON.exists() else sys.executable
