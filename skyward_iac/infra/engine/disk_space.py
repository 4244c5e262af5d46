"""What a full disk looks like to us: how much is free where, and the error that says so.

Both the engine's writes (a checkpoint, a lock, the stack's settings) and our own (state
repair restoring a checkpoint) can fail for want of space; both are reported the same way: the
path that could not be written, what is free on its filesystem, and what the write needed when
that is known.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from skyward_iac.api.errors import OutOfSpaceError

#: The ``errno`` values that mean "no room": the disk (ENOSPC) or the user's quota (EDQUOT).
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


def human_bytes(count: int) -> str:
    """``1536`` -> ``"1.5 KiB"``: binary units, one decimal above bytes."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{count} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def free_bytes(path: Path) -> int | None:
    """Bytes this process may still write on the filesystem holding ``path`` (or its nearest
    existing parent: the path itself may be what could not be created); None if unknown.
    Root may also use the blocks a filesystem reserves for it, as the engine running as root
    does."""
    for candidate in (path, *path.parents):
        try:
            stats = os.statvfs(candidate)
        except OSError:
            continue
        blocks = stats.f_bfree if os.geteuid() == 0 else stats.f_bavail
        return blocks * stats.f_frsize
    return None


def out_of_space(path: Path, lead: str, needed: int | None = None, needed_for: str = "",
                 detail: str = "") -> OutOfSpaceError:
    """The error for a write to ``path`` that found (or would find) no room. ``lead`` says
    what happened ("pulumi destroy could not write <path>"); the message goes on with what is
    free there and, when known, roughly what was needed (``needed_for`` says what for, such
    as " to update the stack"). ``detail`` (what the engine said) comes first, so the sentence
    that says what to do is the last line, the one summaries keep."""
    free = free_bytes(path)
    room = [f"{human_bytes(free)} free there"] if free is not None else []
    if needed is not None:
        room.append(f"about {human_bytes(needed)} needed{needed_for}")
    message = ((f"{detail}\n" if detail else "")
               + f"{lead}: no space left on its filesystem"
               + (f" ({', '.join(room)})" if room else "")
               + ". Free some space there (or move SKYWARD_HOME), then run the command again; "
               "`skyward-iac gc` and `skyward-iac down` mend what a failed write left in "
               "the state backend")
    return OutOfSpaceError(message, path=path, free=free, needed=needed)


def is_no_room(exc: BaseException) -> bool:
    """Whether ``exc`` is an ``OSError`` for want of space (disk or quota)."""
    return isinstance(exc, OSError) and exc.errno in NO_ROOM
