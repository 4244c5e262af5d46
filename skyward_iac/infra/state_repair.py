"""Mend what an engine stopped in the middle of a write leaves in a file backend.

The file backend keeps each blob beside a ``.attrs`` sidecar (content type, md5), written
separately. An engine killed between the two writes leaves a 0-byte or half-written sidecar,
after which every read of that blob fails (``failed to load checkpoint: EOF``) for the engine,
``pulumi`` by hand, ``gc`` and ``down`` alike. A sidecar holds nothing the engine needs
(without one it reads the blob unverified), so a broken one is removed; a checkpoint left
empty is restored from the ``.bak`` the engine writes before every checkpoint.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

log = logging.getLogger("skyward")


#: A file younger than this may still be being written by a running engine: left alone.
SETTLE = 10.0


def _settled(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime > SETTLE
    except OSError:
        return False


def _broken_json(path: Path) -> bool:
    try:
        json.loads(path.read_bytes() or b"!")
    except (OSError, ValueError):
        return True
    return False


def repair(state_dir: Path) -> list[str]:
    """Remove broken ``.attrs`` sidecars and restore empty checkpoints from their backup
    under ``state_dir/.pulumi``; returns what was mended (nothing for a sound backend)."""
    root = state_dir / ".pulumi"
    mended: list[str] = []
    if not root.is_dir():
        return mended
    for sidecar in root.rglob("*.attrs"):
        if _settled(sidecar) and _broken_json(sidecar):
            sidecar.unlink(missing_ok=True)
            mended.append(f"removed the broken {sidecar.relative_to(state_dir)}")
    for checkpoint in (root / "stacks").rglob("*.json"):
        backup = checkpoint.with_name(checkpoint.name + ".bak")
        if (_settled(checkpoint) and _broken_json(checkpoint) and backup.is_file()
                and not _broken_json(backup)):
            shutil.copyfile(backup, checkpoint)
            mended.append(f"restored {checkpoint.relative_to(state_dir)} from its backup")
    for line in mended:
        log.warning("state repair: %s", line)
    return mended
