"""``Image.includes``: the user's local directories and ``.py`` files, shipped to every node as
one tar.gz and importable there.

Layout on the node (``<workdir>/includes``): every include keeps its own name at the top, and
that directory is on ``sys.path``, so a package directory (``./mypkg`` with ``__init__.py``)
and a module (``./helpers.py``) import by name. A directory without ``__init__.py`` (a
``src/`` layout) is put on ``sys.path`` itself as well, so what it holds imports by name too.

``excludes`` are glob patterns (``fnmatch``) matched against each file's and directory's path
relative to its include (``data/*.csv``) and against its bare name (``*.ckpt``, ``.git``); an
excluded directory is skipped whole. ``__pycache__`` is never shipped.
"""

from __future__ import annotations

import fnmatch
import io
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from skyward_iac.api.includes import check_includes

ALWAYS_EXCLUDED = ("__pycache__",)


@dataclass(frozen=True, slots=True)
class IncludesArchive:
    """The includes as a tar.gz, and the directories (relative to where it is unpacked) that go
    on the node's ``sys.path``."""

    data: bytes
    import_roots: tuple[str, ...]


def is_excluded(relative: PurePosixPath, excludes: Sequence[str]) -> bool:
    """Whether a path (relative to its include) matches one of the patterns, by path or name."""
    patterns = (*ALWAYS_EXCLUDED, *excludes)
    text = relative.as_posix()
    return any(fnmatch.fnmatchcase(text, p) or fnmatch.fnmatchcase(relative.name, p)
               for p in patterns)


def build_archive(includes: Sequence[str], excludes: Sequence[str]) -> IncludesArchive:
    """Pack the includes (in the order given, files sorted) into one tar.gz."""
    check_includes(includes, excludes)
    buffer = io.BytesIO()
    roots = ["."]
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for include in includes:
            path = Path(include).expanduser().resolve()
            if path.is_file():
                tar.add(path, arcname=path.name, recursive=False)
                continue
            if not (path / "__init__.py").exists():
                roots.append(path.name)
            tar.add(path, arcname=path.name, recursive=False)
            for member, relative in _walk(path, excludes):
                tar.add(member, arcname=f"{path.name}/{relative.as_posix()}", recursive=False)
    return IncludesArchive(buffer.getvalue(), tuple(roots))


def _walk(root: Path, excludes: Sequence[str]) -> list[tuple[Path, PurePosixPath]]:
    found = []
    for directory, dirs, files in os.walk(root):
        here = PurePosixPath(Path(directory).relative_to(root).as_posix())
        dirs[:] = sorted(d for d in dirs if not is_excluded(here / d, excludes))
        for name in [*dirs, *sorted(files)]:
            relative = here / name
            if name in files and is_excluded(relative, excludes):
                continue
            found.append((Path(directory) / name, PurePosixPath(os.path.normpath(relative))))
    return found
