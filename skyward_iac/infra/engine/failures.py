"""What a failed (or ill-advised) engine command is, decided once for every command we run.

``EngineCommand`` asks two things here. Before a command that writes the state backend:
is there room for it (``lacking_room``)? On a full disk the file backend's failed writes do
harm, not only fail: a blob of 512 bytes or more (a checkpoint, the tags of a stack with many)
is renamed into place cut short (``state_repair`` says why), so such a command is not started
and ``OutOfSpaceError`` says what is free and what it needs. After a failure: which kind is it
(``classify``)? A lost race on the tags file is run again; ``NO_ROOM`` becomes
``OutOfSpaceError`` naming the path the engine could not write; ``BROKEN_STATE``, the engine's
``unexpected end of JSON input`` that names no file, is mended by ``state_repair``, and what
could not be mended yet is named (``broken_state_hint``).
"""

from __future__ import annotations

import enum
import itertools
import os
import re
from collections.abc import Mapping
from pathlib import Path

from pulumi.automation import CommandResult

from skyward_iac.api.errors import OutOfSpaceError
from skyward_iac.infra.engine.disk_space import free_bytes, out_of_space
from skyward_iac.infra.engine.state_repair import SETTLE, SETTLE_SMALL, broken_files


class Failure(enum.Enum):
    """The failures of an engine run that we act on."""

    #: It read a stack's tags file while another command (a lease renewal, say) rewrote it;
    #: nothing was done yet, so the command is simply run again.
    TAGS_RACE = "tags race"
    #: A write found no room on its filesystem (or quota): ``OutOfSpaceError``.
    NO_ROOM = "no room"
    #: It read a file of the state backend that is empty or cut short.
    BROKEN_STATE = "broken state"


#: The engine's words for each failure (Go's texts for ENOSPC/EDQUOT, a truncated JSON), in
#: the order they are looked for: a full disk wins over what it caused.
SIGNS = {
    Failure.NO_ROOM: ("no space left on device", "disk quota exceeded"),
    Failure.TAGS_RACE: ("failed to read stack tags file",),
    # A file cut short, or a broken sidecar ("failed to load checkpoint: EOF").
    Failure.BROKEN_STATE: ("unexpected end of JSON input", "failed to load checkpoint"),
}
#: The tags race by its text (callers and tests name it so).
TAGS_FILE_RACE = SIGNS[Failure.TAGS_RACE][0]
#: A path the engine could not write, as Go prints it (``write /a/b.tmp: no space left...``).
NO_ROOM_PATH = re.compile(r"(/[^\s:]+): (?:no space left on device|disk quota exceeded)")
#: Roughly what one update writes, in checkpoints of its stack: the ``.bak`` copy, the new
#: checkpoint beside the old one until its rename, and the copies kept in history and backups.
CHECKPOINTS_PER_UPDATE = 4
#: A destroy's checkpoints shrink as it goes and the copies it keeps are of the empty one:
#: the ``.bak`` and the new checkpoint. (Measured on a tmpfs: the peak a destroy of a 1-node
#: Local pool added was 1.4 times its checkpoint, of a 3-node pool 0.9 times.)
CHECKPOINTS_PER_DESTROY = 2
#: And the small files around them (lock, history entry, sidecars: a block or page each).
UPDATE_OVERHEAD = 64 * 1024
#: What a command writing only small files (a lock, the tags, a new stack) needs.
SMALL_WRITE = 16 * 1024
#: Commands that write the state backend: updates (lock, checkpoints, history) ...
UPDATES = frozenset({"up", "update", "destroy", "refresh", "import"})
#: ... and those that write small files only (``preview`` takes the lock).
SMALL_WRITES = frozenset({"preview", "stack init", "stack tag set", "stack tag rm"})


def classify(result: CommandResult) -> Failure | None:
    """What kind of failure ``result`` is, or None (a success, or one left to the SDK's own
    ``create_command_error``)."""
    if result.code == 0:
        return None
    text = f"{result.stderr}\n{result.stdout}"
    return next((failure for failure, signs in SIGNS.items()
                 if any(sign in text for sign in signs)), None)


def command_name(args: list[str]) -> str:
    """``destroy``, ``stack tag set``...: the command's leading words (at most three)."""
    words = itertools.takewhile(lambda arg: not arg.startswith("-"),
                                itertools.dropwhile(lambda arg: arg.startswith("-"), args))
    return " ".join(list(words)[:3])


def _is(name: str, commands: frozenset[str]) -> bool:
    return any(name == command or name.startswith(command + " ") for command in commands)


def stack_of(args: list[str]) -> str | None:
    """The stack a command runs on (``--stack [org/project/]name``), if it names one."""
    for flag, value in itertools.pairwise(args):
        if flag in ("--stack", "-s"):
            return value.rsplit("/", 1)[-1]
    return None


def backend_dir(env: Mapping[str, str]) -> Path | None:
    """The file backend a command runs against, from its environment (None for others)."""
    url = env.get("PULUMI_BACKEND_URL") or os.environ.get("PULUMI_BACKEND_URL", "")
    return Path(url.removeprefix("file://").split("?")[0]) if url.startswith("file://") else None


def checkpoint_size(backend: Path, stack: str | None) -> int | None:
    """The size of ``stack``'s checkpoint (or its backup, if larger) in ``backend``."""
    if stack is None:
        return None
    sizes = [path.stat().st_size for path in backend.glob(f".pulumi/stacks/*/{stack}.json*")
             if not path.name.endswith((".attrs", ".tmp"))]
    return max(sizes) if sizes else None


def update_needs(checkpoint: int | None, destroy: bool = False) -> int:
    """Roughly the free space one update (``destroy``: one destroy) of a stack whose
    checkpoint is ``checkpoint`` bytes needs; ``SMALL_WRITE`` for a stack not written yet."""
    if checkpoint is None:
        return SMALL_WRITE
    copies = CHECKPOINTS_PER_DESTROY if destroy else CHECKPOINTS_PER_UPDATE
    return copies * checkpoint + UPDATE_OVERHEAD


def room_needed(args: list[str], checkpoint: int | None) -> int | None:
    """The free space the command ``args`` needs in the state backend, or None for one that
    writes nothing there (reads, ``cancel`` and ``stack rm``, which only delete)."""
    name = command_name(args)
    if _is(name, UPDATES):
        return update_needs(checkpoint, destroy=name == "destroy")
    return SMALL_WRITE if _is(name, SMALL_WRITES) else None


def lacking_room(args: list[str], env: Mapping[str, str]) -> OutOfSpaceError | None:
    """The error to raise instead of running ``args`` on a file backend without the room it
    needs (None: run it). Only a guard: the disk may still fill while the command runs."""
    backend = backend_dir(env)
    if backend is None or room_needed(args, None) is None:
        return None  # reads (most commands) cost no look at the disk
    needed = room_needed(args, checkpoint_size(backend, stack_of(args)))
    free = free_bytes(backend)
    if needed is None or free is None or free >= needed:
        return None
    return out_of_space(backend, needed=needed, needed_for=_needed_for(args),
                        lead=f"pulumi {command_name(args)} was not started, so that it cannot "
                             f"leave files cut short in {backend}")


def no_room_error(result: CommandResult, args: list[str], cwd: str,
                  env: Mapping[str, str]) -> OutOfSpaceError:
    """The ``OutOfSpaceError`` for a run that found no room: the path the engine names (else
    the backend, else the workspace), what is free there and roughly what the command needs."""
    text = f"{result.stderr}\n{result.stdout}"
    backend = backend_dir(env)
    named = NO_ROOM_PATH.search(text)
    path = Path(named.group(1)) if named else backend or Path(cwd)
    checkpoint = checkpoint_size(backend, stack_of(args)) if backend else None
    said = [line.strip() for line in text.splitlines() if line.strip()][-5:]
    return out_of_space(path, needed=room_needed(args, checkpoint), needed_for=_needed_for(args),
                        lead=f"pulumi {command_name(args)} could not write {path}",
                        detail="the engine said:\n  " + "\n  ".join(said))


def _needed_for(args: list[str]) -> str:
    return " to update the stack" if _is(command_name(args), UPDATES) else ""


def broken_state_hint(env: Mapping[str, str]) -> str:
    """What to add to a ``BROKEN_STATE`` failure that repair could not mend: the broken files
    (the engine names none) and when they will be mended."""
    backend = backend_dir(env)
    broken = broken_files(backend, settled_only=False) if backend else []
    if not broken:
        return ""
    names = ", ".join(str(path) for path, _ in broken)
    return (f"\nskyward: the state backend holds files that are empty or cut short: {names}. "
            f"Run the command again in a few seconds: they are mended (removed, moved aside to "
            f"{backend}/skyward-quarantine, or restored from a backup) once no engine may still "
            f"be writing them ({SETTLE_SMALL:.0f} s; {SETTLE:.0f} s for *.tmp files)")
