"""How an engine failure is told apart (once, in ``engine_failures``) and what each kind
becomes: a full disk an ``OutOfSpaceError`` naming the path and the space, a broken state file
a repair and a second run, or, when it cannot be mended yet, an error naming the file. The
engine here is a shell script standing in for the CLI; the full disk itself is in
tests/chaos/test_full_disk.py."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from pulumi.automation import CommandResult
from pulumi.automation.errors import CommandError

from skyward_iac.api.errors import OutOfSpaceError, ProvisionError
from skyward_iac.infra.engine.command import ATTEMPTS, EngineCommand
from skyward_iac.infra.engine.disk_space import human_bytes
from skyward_iac.infra.engine.failures import (
    CHECKPOINTS_PER_DESTROY,
    CHECKPOINTS_PER_UPDATE,
    SMALL_WRITE,
    UPDATE_OVERHEAD,
    Failure,
    classify,
    command_name,
    room_needed,
    stack_of,
)

LOCK_TMP = ".pulumi/locks/organization/skyward/s/1.json.18eb64b46d271995.tmp"

#: Fails as the real engine does while the stack's lock directory holds a broken file.
BROKEN_LOCK_ENGINE = """#!/bin/sh
if [ "$2" = version ] || [ "$1" = version ]; then echo v3.259.0; exit 0; fi
runs=$(($(cat "$RUNS" 2>/dev/null || echo 0) + 1)); echo $runs > "$RUNS"
for lock in "$STATE"/.pulumi/locks/*/*/*/*; do
  if [ -e "$lock" ]; then echo "error: unexpected end of JSON input" >&2; exit 255; fi
done
echo "refreshed on run $runs"
"""

#: Fails as the real engine does when its lock write finds no room (its own words).
FULL_DISK_ENGINE = """#!/bin/sh
if [ "$2" = version ] || [ "$1" = version ]; then echo v3.259.0; exit 0; fi
echo "error: 2 errors occurred:" >&2
echo "    1) write $STATE/LOCK_TMP: no space left on device" >&2
echo "    2) Unknown" >&2
exit 255
""".replace("LOCK_TMP", LOCK_TMP)


#: Reads a checkpoint whose sidecar another engine is rewriting in place, on its first run only.
SIDECAR_RACE_ENGINE = """#!/bin/sh
if [ "$2" = version ] || [ "$1" = version ]; then echo v3.259.0; exit 0; fi
runs=$(($(cat "$RUNS" 2>/dev/null || echo 0) + 1)); echo $runs > "$RUNS"
if [ $runs = 1 ]; then echo "error: failed to load checkpoint: EOF" >&2; exit 255; fi
echo "selected on run $runs"
"""


def engine(tmp_path: Path, script: str) -> tuple[EngineCommand, dict[str, str]]:
    binary = tmp_path / "bin" / "pulumi"
    binary.parent.mkdir()
    binary.write_text(script)
    binary.chmod(0o755)
    state = tmp_path / "state"
    (state / ".pulumi" / "stacks" / "skyward").mkdir(parents=True)
    env = {"RUNS": str(tmp_path / "runs"), "STATE": str(state),
           "PULUMI_BACKEND_URL": f"file://{state}"}
    return EngineCommand(root=str(tmp_path)), env


def broken_lock(state: Path, age: float) -> Path:
    lock = state / LOCK_TMP
    lock.parent.mkdir(parents=True)
    lock.write_bytes(b"")
    os.utime(lock, (time.time() - age,) * 2)
    return lock


def runs(tmp_path: Path) -> int:
    return int((tmp_path / "runs").read_text())


@pytest.mark.parametrize(("stderr", "stdout", "kind"), [
    ("error: write /s/.pulumi/locks/x.json.1.tmp: no space left on device", "", Failure.NO_ROOM),
    ("", "error: failed to save snapshot: ... disk quota exceeded", Failure.NO_ROOM),
    ("error: unexpected end of JSON input", "", Failure.BROKEN_STATE),
    ("error: failed to load checkpoint: place 1: unexpected end of JSON input", "",
     Failure.BROKEN_STATE),
    ("error: failed to load checkpoint: EOF", "", Failure.BROKEN_STATE),  # a broken sidecar
    ("error: failed to read stack tags file: EOF", "", Failure.TAGS_RACE),
    # A full disk wins over the broken file it caused.
    ("unexpected end of JSON input\nwrite /a: no space left on device", "", Failure.NO_ROOM),
    ("error: the stack is currently locked by 1 lock(s)", "", None),
])
def test_each_failure_is_told_apart_once(stderr: str, stdout: str, kind: Failure | None) -> None:
    assert classify(CommandResult(stdout=stdout, stderr=stderr, code=255)) is kind
    assert classify(CommandResult(stdout=stdout, stderr=stderr, code=0)) is None


def test_what_a_command_writes_to_the_backend() -> None:
    destroy = ["--non-interactive", "destroy", "--yes", "--stack", "organization/skyward/s"]
    assert command_name(destroy) == "destroy" and stack_of(destroy) == "s"
    assert room_needed(destroy, 24_000) == CHECKPOINTS_PER_DESTROY * 24_000 + UPDATE_OVERHEAD
    assert room_needed(destroy, None) == SMALL_WRITE  # a stack never written yet
    up = ["--non-interactive", "up", "--yes", "--skip-preview", "--stack", "s"]
    assert room_needed(up, 24_000) == CHECKPOINTS_PER_UPDATE * 24_000 + UPDATE_OVERHEAD
    tag_set = ["--non-interactive", "stack", "tag", "set", "skyward:lease", "x", "--stack", "s"]
    assert command_name(tag_set) == "stack tag set" and room_needed(tag_set, 24_000) == SMALL_WRITE
    for reads in (["stack", "tag", "ls", "--stack", "s"], ["stack", "export", "--stack", "s"],
                  ["stack", "select", "--stack", "s"], ["cancel", "--yes", "--stack", "s"],
                  ["stack", "rm", "--yes", "s"]):
        assert room_needed(reads, 24_000) is None, reads


def test_a_broken_lock_is_mended_and_the_command_runs_again(tmp_path: Path) -> None:
    command, env = engine(tmp_path, BROKEN_LOCK_ENGINE)
    lock = broken_lock(Path(env["STATE"]), age=5)
    result = command.run(["refresh", "--yes", "--stack", "s"], str(tmp_path), env)
    assert result.stdout == "refreshed on run 2"
    assert not lock.exists()


def test_a_broken_file_too_young_to_mend_is_mended_once_it_settles(tmp_path: Path) -> None:
    command, env = engine(tmp_path, BROKEN_LOCK_ENGINE)
    lock = broken_lock(Path(env["STATE"]), age=0)
    result = command.run(["refresh", "--yes", "--stack", "s"], str(tmp_path), env)
    assert result.stdout == "refreshed on run 3"  # waited 1 s, mended, ran again
    assert not lock.exists()


def test_a_file_still_broken_after_the_last_attempt_is_named(tmp_path: Path) -> None:
    # Every run of this engine leaves a fresh broken lock: it never settles.
    command, env = engine(tmp_path, BROKEN_LOCK_ENGINE.replace(
        'for lock', f': > "$STATE/{LOCK_TMP}"\nfor lock'))
    lock = broken_lock(Path(env["STATE"]), age=0)
    with pytest.raises(CommandError) as raised:
        command.run(["refresh", "--yes", "--stack", "s"], str(tmp_path), env)
    assert f"files that are empty or cut short: {lock}." in str(raised.value)
    assert runs(tmp_path) == ATTEMPTS and lock.exists()


def test_a_state_file_read_while_being_written_is_read_again(tmp_path: Path) -> None:
    # CI, 2026-11-26: a test's `stack select` met the keeper's destroy rewriting the sidecar.
    command, env = engine(tmp_path, SIDECAR_RACE_ENGINE)
    result = command.run(["stack", "select", "--stack", "s"], str(tmp_path), env)
    assert result.stdout == "selected on run 2"


def test_a_full_disk_names_the_path_and_the_space(tmp_path: Path) -> None:
    command, env = engine(tmp_path, FULL_DISK_ENGINE)
    checkpoint = Path(env["STATE"]) / ".pulumi" / "stacks" / "skyward" / "s.json"
    checkpoint.write_text("{}" * 5000)
    with pytest.raises(OutOfSpaceError) as raised:
        command.run(["destroy", "--yes", "--stack", "s"], str(tmp_path), env)
    error = raised.value
    assert isinstance(error, ProvisionError)  # callers that handle engine failures still do
    assert error.path == Path(env["STATE"]) / LOCK_TMP
    assert error.needed == CHECKPOINTS_PER_DESTROY * 10_000 + UPDATE_OVERHEAD
    assert error.free is not None and error.free > 0  # this disk is not full
    lines = str(error).splitlines()
    assert lines[0] == "the engine said:" and "no space left on device" in lines[2]
    assert lines[-1].startswith(f"pulumi destroy could not write {error.path}: no space left "
                                f"on its filesystem ({human_bytes(error.free)} free there, "
                                f"about {human_bytes(error.needed)} needed to update the stack)")


@pytest.mark.parametrize(("count", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (157 * 1024 + 300, "157.3 KiB"),
    (5 * 1024**3, "5.0 GiB"), (3 * 1024**4, "3072.0 GiB"),
])
def test_sizes_read_as_people_write_them(count: int, text: str) -> None:
    assert human_bytes(count) == text


#: An ``up`` that runs until SIGINT, then exits as the engine does after a cancel.
SLOW_UP_ENGINE = """#!/bin/sh
if [ "$2" = version ] || [ "$1" = version ]; then echo v3.259.0; exit 0; fi
trap 'echo "error: update canceled" >&2; exit 255' INT
i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
echo "finished"
"""


def test_cancel_stops_a_stacks_up_as_a_first_ctrl_c_does(tmp_path: Path) -> None:
    """``cancel(stack)`` (a spent budget) sends that stack's running ``up`` one SIGINT from
    another thread; another stack's command is left alone."""
    from skyward_iac.infra.engine.command import _cancellable as running_commands
    from skyward_iac.infra.engine.command import cancel

    command, env = engine(tmp_path, SLOW_UP_ENGINE)
    failed: list[BaseException] = []

    def up() -> None:
        try:
            command.run(["up", "--yes", "--stack", "organization/skyward/s"], str(tmp_path), env)
        except BaseException as exc:  # noqa: BLE001 - what the test looks at
            failed.append(exc)

    runner = threading.Thread(target=up)
    started = time.monotonic()
    runner.start()
    deadline = time.monotonic() + 30
    while not running_commands and time.monotonic() < deadline:  # the up has started
        time.sleep(0.05)
    assert cancel("other") == 0  # not that stack's
    assert cancel("s") == 1
    runner.join(30)
    assert not runner.is_alive() and time.monotonic() - started < 30  # it ran 60 s otherwise
    assert len(failed) == 1 and isinstance(failed[0], CommandError)
    assert "update canceled" in str(failed[0])
