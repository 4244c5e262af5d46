"""Facts about local processes, shared by the Local node provider and the etcd launcher."""

from __future__ import annotations

import os
from pathlib import Path


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie counts as dead (and is reaped if it is our child)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
