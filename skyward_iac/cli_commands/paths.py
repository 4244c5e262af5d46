"""Paths given to ``skyward-iac``, resolved once against the caller's working directory.

The engine and the processes it starts run in directories of their own (the workspace), so a
relative path handed on as it was typed would name another file there.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variables that name files or directories, made absolute for every child process.
PATH_VARIABLES = ("SKYWARD_HOME", "SKYWARD_POLICY", "SKYWARD_PULUMI_ROOT")


def path_arg(text: str) -> Path:
    """An argparse type: ``text`` as an absolute path (``~`` expanded), relative to the
    working directory of the command (``..`` folded, symlinks kept)."""
    return Path(os.path.abspath(Path(text).expanduser()))


def absolute_environment() -> None:
    """Make the path variables of this process's environment absolute (children inherit it)."""
    for name in PATH_VARIABLES:
        if value := os.environ.get(name):
            os.environ[name] = str(path_arg(value))
