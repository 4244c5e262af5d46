"""Checking ``Image.includes`` and ``Image.excludes`` when the Image is built (the archive
itself is built by ``remote/includes.py``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from skyward_iac.api.errors import ConfigError


def check_includes(includes: Sequence[str], excludes: Sequence[str]) -> None:
    """Fail with a ``ConfigError`` naming the problem: a missing path, one that is neither a
    directory nor a ``.py`` file, two includes with the same name, an empty pattern."""
    names: dict[str, str] = {}
    for include in includes:
        path = Path(include).expanduser()
        if not path.exists():
            raise ConfigError(f"Image.includes: {include!r} does not exist (relative paths are "
                              f"taken from the current directory, {os.getcwd()})")
        if not (path.is_dir() or (path.is_file() and path.suffix == ".py")):
            raise ConfigError(f"Image.includes: {include!r} must be a directory or a .py file")
        name = path.resolve().name
        if name in names:
            raise ConfigError(f"Image.includes: {names[name]!r} and {include!r} would both land "
                              f"on the node as {name!r}; rename one or include their parent")
        names[name] = include
    for pattern in excludes:
        if not isinstance(pattern, str) or not pattern.strip():
            raise ConfigError(f"Image.excludes: empty pattern {pattern!r}")
