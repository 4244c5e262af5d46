"""Imports point one way: each package imports only the layers below it, and ``api`` (the
public contracts) imports nothing above it. The layers are declared in pyproject.toml
(``[tool.importlinter]``) and checked with import-linter, as contributors run it. A second
contract keeps the node package (what runs on a node) off every client-side package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_packages_import_only_the_layers_below_them() -> None:
    linter = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(linter), "--no-cache"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 2 kept, 0 broken" in done.stdout, done.stdout
