"""Mend what an engine stopped in the middle of a write leaves in a file backend.

The file backend (gocloud.dev's fileblob) writes every blob to ``<name>.<hex>.tmp`` beside its
place and renames it over the place, then writes the ``.attrs`` sidecar (content type, md5)
in place. An engine killed, or out of disk space, leaves:

* a temporary file. A blob under 512 bytes (a lock, the tags) is written only when it is
  closed, so on a full disk the file is created, its write refused and the file forgotten: 0
  bytes. Beside a checkpoint it only wastes space, but every file in ``.pulumi/locks/<stack>``
  is read as a lock, so one there makes every later update of the stack fail with
  ``unexpected end of JSON input``, naming no file;
* a blob cut short *in its place*: a larger blob (a checkpoint, a backup) whose write failed is
  still renamed into place, because the check before the rename compares the md5 of what it
  was asked to write, not of what reached the disk. On a full disk the checkpoint itself
  becomes 0 bytes; the engine copied the previous one to ``<stack>.json.bak`` just before;
* a 0-byte or half-written sidecar (the engine killed while writing it), after which every
  read of its blob fails.

The remedy follows one rule. An empty file holds nothing: it is removed. A broken file with
content is moved aside into ``skyward-quarantine/<time>/`` beside ``.pulumi``, never deleted:
it may be the only copy of something (a checkpoint that only a rename failed to put in place),
and someone may want to read it. A broken checkpoint is replaced by the newest sound copy:
normally its ``.bak`` (the state before the write that failed, pending operations included),
or a copy kept in its history or backups (the end of the last finished update); with none it
is only reported, since taking it away would drop the stack and its resources from the record.
A broken lock is never someone's lock: an engine whose lock write failed does not go on.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from skyward_iac.api.errors import OutOfSpaceError
from skyward_iac.infra.engine.disk_space import is_no_room, out_of_space

log = logging.getLogger("skyward")

#: A temporary file younger than this may still be being written by a running engine.
SETTLE = 10.0
#: How old anything else must be. Blobs reach their place by a rename, whole or (on a full
#: disk) already cut short, so only sidecars are ever written in place, in microseconds, and
#: taking one from a live writer is harmless (the blob is then read unverified); the same holds
#: for a lock (that engine's lock attempt fails before it changes anything). So a stack is
#: destroyable a second after a failed write.
SETTLE_SMALL = 1.0
#: Where broken files with content are moved, beside ``.pulumi`` (the engine never looks).
QUARANTINE = "skyward-quarantine"
#: The files the rule judges: the engine's JSON blobs, their sidecars and backups. Others
#: (``meta.yaml``, whose absence would change how the engine lays out the backend) never.
JUDGED = (".json", ".json.gz", ".json.zst", ".json.bak", ".attrs", ".pulumi-tags")
#: ``<name>.<hex nanoseconds>.tmp``: a write that was never renamed into place.
TEMPORARY = re.compile(r".+\.[0-9a-f]+\.tmp")

Remedy = Literal["remove", "quarantine", "restore", "report"]


# The rule reads paths relative to the state dir as posix strings (".pulumi/locks/..."):
# the walk meets thousands of files, and building a Path for each was most of its time.


def _name(rel: str) -> str:
    return rel.rsplit("/", 1)[-1]


def is_temporary(rel: str) -> bool:
    """Whether ``rel`` is a write the engine never finished."""
    return TEMPORARY.fullmatch(_name(rel)) is not None


def is_checkpoint(rel: str) -> bool:
    """Whether ``rel`` is a stack's current checkpoint."""
    return rel.startswith(".pulumi/stacks/") and rel.endswith((".json", ".json.gz", ".json.zst"))


def is_lock(rel: str) -> bool:
    """Whether ``rel`` lies in the locks directory (every file there is read as a lock)."""
    return rel.startswith(".pulumi/locks/")


def judged(rel: str) -> bool:
    """Whether the rule looks at ``rel`` at all."""
    return rel.endswith(JUDGED) or is_lock(rel) or is_temporary(rel)


def parsed(rel: str) -> bool:
    """Whether ``rel`` is parsed to judge it: locks, the stacks' checkpoints and tags, and
    their sidecars (what every command reads). History entries and backups (some per update,
    ever, and read by no update) and their sidecars are judged by size: a failed write leaves
    them empty, and parsing them all would slow every ``gc``."""
    if rel.startswith((".pulumi/history/", ".pulumi/backups/")):
        return False
    return (is_lock(rel) or rel.endswith((".attrs", ".pulumi-tags"))
            or (is_checkpoint(rel) and rel.endswith(".json")))


def settle_time(rel: str) -> float:
    """How old ``rel`` must be before the rule touches it (see ``SETTLE_SMALL``)."""
    return SETTLE if is_temporary(rel) and not is_lock(rel) else SETTLE_SMALL


def remedy(rel: str, size: int, sound: bool | None,
           restorable: bool) -> Remedy | None:
    """What to do with the settled file ``rel`` of ``size`` bytes: None for a sound one.
    ``sound`` says whether it parsed (None: not parsed); ``restorable`` whether a broken
    checkpoint has a sound copy to come back from."""
    if is_temporary(rel):
        return "remove" if size == 0 else "quarantine"
    if size > 0 and sound is not False:
        return None
    if is_checkpoint(rel):
        return "restore" if restorable else "report"
    return "remove" if size == 0 else "quarantine"


def stack_dirs(rel: str, kind: str) -> str:
    """``.pulumi/<kind>/<project>/<stack>`` for the stack whose checkpoint is ``rel``: where
    the engine keeps its history (``kind="history"``) or backups, a checkpoint copy each."""
    parts = rel.split("/")
    return "/".join([".pulumi", kind, *parts[2:-1], parts[-1].split(".json")[0]])


def _sound_json(path: Path) -> bool:
    try:
        json.loads(path.read_bytes() or b"!")
    except (OSError, ValueError):
        return False
    return True


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0  # removed meanwhile: last, and found unsound below


def restore_source(state_dir: Path, rel: str) -> Path | None:
    """The newest sound copy of the checkpoint ``rel``: its ``.bak`` or a checkpoint copy in
    its history or backups, whichever was written last (the ``.bak`` on a tie: a copy of it
    that failed on a full disk leaves an older one, older than the last update's copies);
    None when there is none (or it is compressed, which this repair leaves alone)."""
    if not rel.endswith(".json"):
        return None
    path = state_dir / rel
    copies = [path.with_name(path.name + ".bak")] + [
        copy for kind, pattern in (("history", "*.checkpoint.json"), ("backups", "*.json"))
        for copy in (state_dir / stack_dirs(rel, kind)).glob(pattern)]
    copies.sort(key=_mtime, reverse=True)  # stable: the .bak first among equals
    return next((copy for copy in copies if copy.is_file() and _sound_json(copy)), None)


def _files(root: str) -> Iterator[tuple[str, os.stat_result]]:
    """Every regular file under ``root`` with its ``stat``, one call each (a backend holds
    some files per update ever made, and every pool start's gc walks it)."""
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from _files(entry.path)
            elif entry.is_file(follow_symlinks=False):
                yield entry.path, entry.stat(follow_symlinks=False)
        except OSError:
            continue  # removed meanwhile


def broken_files(state_dir: Path, settled_only: bool = True) -> list[tuple[Path, Remedy]]:
    """Every file under ``state_dir/.pulumi`` the rule would mend, with its remedy
    (``settled_only=False`` also names those too young to touch yet)."""
    found: list[tuple[Path, Remedy]] = []
    now, prefix = time.time(), len(str(state_dir)) + 1
    for path, stat in _files(str(state_dir / ".pulumi")):
        rel = path[prefix:].replace(os.sep, "/")
        if not judged(rel) or (settled_only and now - stat.st_mtime <= settle_time(rel)):
            continue
        size = stat.st_size
        sound = _sound_json(Path(path)) if size and parsed(rel) else None
        broken = is_checkpoint(rel) and (size == 0 or sound is False)
        restorable = broken and restore_source(state_dir, rel) is not None
        if action := remedy(rel, size, sound, restorable):
            found.append((Path(path), action))
    return found


@dataclass(frozen=True, slots=True)
class Outcome:
    """What repair did with one file: ``line`` names it and the deed; ``mended`` is False
    when it could not (``no_room`` then says so when space was what it lacked)."""

    line: str
    mended: bool = True
    no_room: OutOfSpaceError | None = None


def mend(state_dir: Path) -> list[Outcome]:
    """Mend every broken file under ``state_dir/.pulumi`` (see the module doc), logging one
    line per file; nothing for a sound backend."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    outcomes = [_apply(path, action, state_dir, state_dir / QUARANTINE / stamp)
                for path, action in broken_files(state_dir)]
    for outcome in outcomes:
        log.warning("state repair: %s", outcome.line)
    return outcomes


def repair(state_dir: Path) -> list[str]:
    """``mend``, as lines naming each file and what was done (or could not be)."""
    return [outcome.line for outcome in mend(state_dir)]


def _apply(path: Path, action: Remedy, state_dir: Path, quarantine: Path) -> Outcome:
    rel = path.relative_to(state_dir).as_posix()
    needed: int | None = None
    try:
        sidecar = path.with_name(path.name + ".attrs")
        if action == "remove":
            what = "a write the engine never finished" if is_temporary(rel) else "unreadable"
            path.unlink(missing_ok=True)
            sidecar.unlink(missing_ok=True)  # it describes what is gone
            return Outcome(f"removed the empty {rel} ({what})")
        if action == "quarantine":
            aside = _move_aside(path, rel, quarantine)
            if sidecar.is_file():
                _move_aside(sidecar, f"{rel}.attrs", quarantine)
            return Outcome(f"moved the broken {rel} aside to {aside}")
        source = restore_source(state_dir, rel) if action == "restore" else None
        if source is None:
            return Outcome(f"{rel} is broken and no sound copy of it is kept; left in place: "
                           "restore it by hand, or remove the stack with `pulumi stack rm "
                           "--force`", mended=False)
        needed = source.stat().st_size
        aside = _move_aside(path, rel, quarantine) if path.stat().st_size else None
        _copy_into_place(source, path)
        # Its sidecar holds the md5 of the broken content: without one the engine reads the
        # restored checkpoint unverified.
        sidecar.unlink(missing_ok=True)
        kept = source.relative_to(state_dir)
        return Outcome(f"restored {rel} from {kept}"
                       + (f" (the broken one is in {aside})" if aside else "")
                       + ("" if source.name.endswith(".bak") else
                          "; resources created after that copy was taken are not in it"))
    except OSError as exc:
        if not is_no_room(exc):
            return Outcome(f"could not mend {rel} ({action}): {exc}", mended=False)
        error = out_of_space(path, needed=needed, needed_for=" to restore it",
                             lead=f"state repair could not write {path}")
        return Outcome(f"could not mend {rel} ({action}): {error}", mended=False, no_room=error)


def _move_aside(path: Path, rel: str, quarantine: Path) -> Path:
    """Move ``path`` to the same place under ``quarantine``: a rename, which needs no room for
    the data, so it works on a full disk as long as the directories can be made."""
    target = quarantine / rel
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.replace(target)
    return target


def _copy_into_place(source: Path, target: Path) -> None:
    """Copy ``source`` over ``target`` through a temporary file renamed into place, as the
    engine writes: a copy cut short (a full disk) never stands in for ``target``; a leftover
    temporary file is mended the next time like any other."""
    temporary = target.with_name(f"{target.name}.{time.time_ns():x}.tmp")
    try:
        shutil.copyfile(source, temporary)
        temporary.replace(target)
    finally:
        temporary.unlink(missing_ok=True)
