"""A full disk during a destroy: a clear error naming the path and the space, and once space
is back, ``gc`` and ``down`` destroy the stack (issue 29, finding 4).

The state backend lives on a small tmpfs of its own (mounted here, unmounted after), filled
the moment a real Local pool starts destroying; the nodes' sandboxes stay in the session's
home, so only the engine's writes meet the full disk.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward_iac.api.errors import OutOfSpaceError
from skyward_iac.infra.engine import locate as engine
from skyward_iac.infra.engine.state_repair import SETTLE_SMALL, mend, repair
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.stack import ClusterStack
from tests.chaos.test_lifecycle_chaos import Child, skyward_iac, wait_until_gone

pytestmark = pytest.mark.chaos
#: How ``OutOfSpaceError`` says it, with what was free.
NO_ROOM = r"no space left on its filesystem \(\d+(\.\d)? (B|KiB) free there"


class SmallDisk:
    """A tmpfs of a few MiB holding the state backend, and a file that fills it."""

    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self.state = mount / "state"
        self.filler = mount / "filler"

    def fill(self) -> None:
        """Take every free byte (``posix_fallocate``: at once, whatever the size)."""
        stats = os.statvfs(self.mount)
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, stats.f_bavail * stats.f_frsize)
        finally:
            os.close(fd)
        assert self.free() == 0

    def make_room(self) -> None:
        self.filler.unlink()

    def free(self) -> int:
        stats = os.statvfs(self.mount)
        return stats.f_bavail * stats.f_frsize

    def leftovers(self, pattern: str) -> list[Path]:
        return sorted(self.state.rglob(pattern))


@pytest.fixture
def small_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[SmallDisk]:
    mount = Path(tempfile.mkdtemp(prefix="skyward-full-disk-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs",
                              str(mount)], check=False, capture_output=True, text=True)
    if mounted.returncode != 0:
        mount.rmdir()
        pytest.skip(f"mounting a tmpfs is not permitted here (it needs root or CAP_SYS_ADMIN): "
                    f"{mounted.stderr.strip()}")
    disk = SmallDisk(mount)
    disk.state.mkdir()
    monkeypatch.setenv("SKYWARD_BACKEND_URL", f"file://{disk.state}")
    try:
        yield disk
    finally:
        unmounted = subprocess.run(["umount", str(mount)], check=False, capture_output=True)
        if unmounted.returncode != 0:  # a straggler holds it: detach it now, freed when done
            subprocess.run(["umount", "--lazy", str(mount)], check=True)
        mount.rmdir()


def destroy_on_a_full_disk(disk: SmallDisk) -> str:
    """A Local pool whose destroy meets a disk that filled as it began; returns its stack."""
    child = Child(nodes=1, ttl=3, mode="exit")
    child.wait_for(r"destroying", timeout=180)
    disk.fill()
    assert child.finish() != 0
    assert child.stack is not None
    output = "\n".join(child.lines)
    # The pool's error says where, what is free there (the engine may have released its lock
    # since: a page or two) and what to do. Which write met the full disk depends on the race
    # with the fill: the engine's lock or a checkpoint ("could not write <file>"), or, filled
    # sooner, our check before the engine starts ("was not started").
    assert re.search(rf"(could not write|cut short in) {disk.mount}/", output), output[-3000:]
    assert re.search(NO_ROOM, output), output[-3000:]
    assert "`skyward-iac gc` and `skyward-iac down` mend" in output
    return child.stack


def leave_a_broken_lock(disk: SmallDisk, stack: str) -> None:
    """What finding 4 saw, left the way it was: the engine run by hand (``pulumi refresh``, as
    docs/operations.md shows) on the full disk fails to write its lock and leaves a 0-byte
    ``*.json.*.tmp`` in the stack's lock directory, which every later update reads."""
    found = engine.find_engine()
    done = subprocess.run(
        [str(found.binary), "refresh", "--yes", "--non-interactive", "--stack", stack],
        cwd=home.workspace_dir(), env={**os.environ, **engine.engine_env(found)},
        capture_output=True, text=True, timeout=120, check=False)
    # Its lock write fails; or, when the pool's own destroy already left such a file, reading
    # that one does, and the engine says only "unexpected end of JSON input" (the finding).
    said = done.stdout + done.stderr
    assert done.returncode != 0
    assert "no space left on device" in said or "unexpected end of JSON input" in said, said
    locks = disk.leftovers(f"locks/**/{stack}/*.json.*.tmp")
    assert locks and all(lock.stat().st_size == 0 for lock in locks), done.stderr
    # Repair takes a lock file once it is SETTLE_SMALL old (a live writer may be at it).
    time.sleep(SETTLE_SMALL + 0.5)


@pytest.mark.parametrize("command", ["gc", "down"])
def test_a_stack_whose_destroy_met_a_full_disk_is_destroyed_once_space_is_back(
    small_disk: SmallDisk, command: str,
) -> None:
    stack = destroy_on_a_full_disk(small_disk)
    # While the disk is full, the stack's own commands refuse to start instead of cutting its
    # files short, and say so; its tags (which gc judges it by) are intact.
    still_full = skyward_iac("down", stack)
    assert still_full.returncode == 1
    assert re.search(NO_ROOM, still_full.stderr), still_full.stderr
    assert str(small_disk.mount) in still_full.stderr
    with pytest.raises(OutOfSpaceError) as raised:
        ClusterStack.select(stack).destroy()
    assert raised.value.path is not None and raised.value.path.is_relative_to(small_disk.mount)
    assert raised.value.free == 0
    assert raised.value.needed is not None and raised.value.needed > 0  # from the stack's size
    assert ClusterStack.select(stack).tags()["owner"]
    leave_a_broken_lock(small_disk, stack)

    small_disk.make_room()
    done = skyward_iac(*(["gc"] if command == "gc" else ["down", stack]))
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert (f"{stack}: destroyed" if command == "gc" else f"{stack} destroyed") in said, said
    # It names what it mended: the lock left by the failed destroy among them.
    assert "removed the empty .pulumi/locks/" in said, said
    assert small_disk.leftovers("locks/**/*.tmp") == []
    assert ClusterStack.select(stack).resource_count() == 0
    wait_until_gone(stack, timeout=30)
    assert "unexpected end of JSON input" not in said


def test_repair_on_a_full_disk_mends_what_needs_no_room_and_cuts_nothing_short(
    small_disk: SmallDisk,
) -> None:
    stacks = small_disk.state / ".pulumi" / "stacks" / "skyward"
    stacks.mkdir(parents=True)
    checkpoint, backup = stacks / "s.json", stacks / "s.json.bak"
    checkpoint.write_bytes(b"")  # renamed into place empty by a write that found no room
    backup.write_text(json.dumps({"version": 3, "checkpoint": {"pad": "x" * 64 * 1024}}))
    lock = small_disk.state / ".pulumi/locks/organization/skyward/s/1.json.1.tmp"
    lock.parent.mkdir(parents=True)
    lock.write_bytes(b"")
    for path in (checkpoint, backup, lock):
        os.utime(path, (time.time() - 5,) * 2)
    small_disk.fill()

    outcomes = {outcome.line.split(" ")[0]: outcome for outcome in mend(small_disk.state)}

    assert not lock.exists() and outcomes["removed"].mended  # a removal needs no room
    short = outcomes["could"]
    assert not short.mended and short.no_room is not None
    assert short.no_room.path == checkpoint and short.no_room.free == 0
    assert short.no_room.needed == backup.stat().st_size
    assert "needed to restore it" in str(short.no_room)
    assert checkpoint.stat().st_size == 0 and list(stacks.glob("*.tmp")) == []  # no half copy
    small_disk.make_room()
    assert repair(small_disk.state) == [
        "restored .pulumi/stacks/skyward/s.json from .pulumi/stacks/skyward/s.json.bak"]
    assert checkpoint.read_bytes() == backup.read_bytes()
