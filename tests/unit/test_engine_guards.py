"""The engine's guards without an engine: who owns a loopback socket, the provider's
interceptor, the Ctrl+C policy per command, and mending broken state files."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from pulumi.automation.errors import CommandError, InvalidVersionError

from skyward_iac.infra.engine.command import (
    ATTEMPTS,
    TAGS_FILE_RACE,
    EngineCommand,
    completed,
    interrupt_policy,
)
from skyward_iac.infra.engine.state_repair import repair
from skyward_iac.processes import is_alive
from skyward_iac.same_user import socket_owner


def test_the_owner_of_a_connected_loopback_socket_is_found() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    try:
        peer = f"ipv4:127.0.0.1:{client.getsockname()[1]}"
        assert socket_owner(peer, server.getsockname()[1]) == os.getuid()
        # The right port but another server: not our connection, so nobody's.
        assert socket_owner(peer, server.getsockname()[1] + 1) is None
        assert socket_owner("ipv6:[::1]:1234", 1) is None
        assert socket_owner("unix:/tmp/x", 1) is None
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize(("args", "policy"), [
    (["destroy", "--yes", "--stack", "s"], "wait"),
    (["up", "--yes", "--stack", "s"], "cancel"),
    (["refresh", "--yes"], "cancel"),
    (["preview"], "cancel"),
])
def test_ctrl_c_never_signals_a_destroy(args: list[str], policy: str) -> None:
    assert interrupt_policy(args) == policy


def test_broken_sidecars_are_removed_and_an_empty_checkpoint_restored(tmp_path: Path) -> None:
    stacks = tmp_path / ".pulumi" / "stacks" / "skyward"
    stacks.mkdir(parents=True)
    good = {"checkpoint": {"latest": {"resources": []}}}
    (stacks / "a.json").write_text(json.dumps(good))
    (stacks / "a.json.attrs").write_text("")  # what an interrupted engine left
    (stacks / "b.json").write_text("")
    (stacks / "b.json.bak").write_text(json.dumps(good))
    (stacks / "c.json").write_text(json.dumps(good))
    (stacks / "c.json.attrs").write_text('{"md5":"x"}')
    old = time.time() - 60
    for path in stacks.iterdir():
        os.utime(path, (old, old))
    mended = repair(tmp_path)
    assert not (stacks / "a.json.attrs").exists()
    assert json.loads((stacks / "b.json").read_text()) == good
    assert (stacks / "c.json.attrs").exists()  # a sound sidecar stays
    assert len(mended) == 2
    assert repair(tmp_path) == []  # nothing left to mend
    (stacks / "d.json.attrs").write_text("")  # just written: may be under way, left alone
    assert repair(tmp_path) == []


FAKE_ENGINE = """#!/bin/sh
if [ "$2" = version ] || [ "$1" = version ]; then echo v3.259.0; exit 0; fi
runs=$(($(cat "$RUNS" 2>/dev/null || echo 0) + 1)); echo $runs > "$RUNS"
if [ "$runs" -le "$FAILS" ]; then echo "error: $FAILURE" >&2; exit 255; fi
echo "updated on run $runs"
"""


def fake_engine(tmp_path: Path) -> EngineCommand:
    binary = tmp_path / "bin" / "pulumi"
    binary.parent.mkdir()
    binary.write_text(FAKE_ENGINE)
    binary.chmod(0o755)
    return EngineCommand(root=str(tmp_path))


@pytest.mark.parametrize(("fails", "runs"), [(1, 2), (2, 3)])
def test_a_command_that_read_the_tags_file_mid_write_runs_again(
    tmp_path: Path, fails: int, runs: int,
) -> None:
    env = {"RUNS": str(tmp_path / "runs"), "FAILS": str(fails),
           "FAILURE": "failed to load stack tags: failed to read stack tags file: EOF"}
    result = fake_engine(tmp_path).run(["up", "--yes"], str(tmp_path), env)
    assert result.stdout == f"updated on run {runs}"
    assert (tmp_path / "runs").read_text().strip() == str(runs)


@pytest.mark.parametrize("failure", [
    "failed to load stack tags: failed to read stack tags file: EOF",  # every attempt lost
    "the stack is locked by another update",  # any other failure: never run again
])
def test_other_failures_and_the_last_attempt_raise(tmp_path: Path, failure: str) -> None:
    env = {"RUNS": str(tmp_path / "runs"), "FAILS": "99", "FAILURE": failure}
    with pytest.raises(CommandError, match=failure.split(":")[0]):
        fake_engine(tmp_path).run(["up", "--yes"], str(tmp_path), env)
    expected = ATTEMPTS if TAGS_FILE_RACE in failure else 1
    assert (tmp_path / "runs").read_text().strip() == str(expected)


def test_a_destroy_a_ctrl_c_let_finish_says_how_it_ended(tmp_path: Path) -> None:
    """The interrupt carries the destroy's own result, so the caller needs no engine command
    (which a further Ctrl+C would interrupt) to know the pool is gone."""
    engine = fake_engine(tmp_path)
    slow = FAKE_ENGINE.replace('echo "updated', 'sleep 1; echo "updated')
    (tmp_path / "bin" / "pulumi").write_text(slow)
    env = {"RUNS": str(tmp_path / "runs"), "FAILS": "0", "FAILURE": ""}
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt) as caught:
        engine.run(["destroy", "--yes"], str(tmp_path), env)
    ended = completed(caught.value)
    assert ended is not None and ended.code == 0 and ended.stdout == "updated on run 1"


def test_a_ctrl_c_while_the_engine_starts_stops_the_engine_before_it_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ctrl+C that lands while ``Popen`` waits for the engine's exec (tens of ms under load)
    is held until the engine is watched, then handled as any other: the engine gets its SIGINT
    and is waited for, then the ``KeyboardInterrupt`` is raised. Raised at once, it left the
    engine running unwatched with its pipes closed: a real ``up`` then died by SIGPIPE holding
    the stack's lock (the flaky Ctrl+C-during-``up`` chaos case)."""
    engine = fake_engine(tmp_path)
    (tmp_path / "bin" / "pulumi").write_text(
        FAKE_ENGINE.replace('echo "updated', 'sleep 30; echo "updated'))
    handler = signal.getsignal(signal.SIGINT)
    started: list[int] = []
    fork_exec = subprocess._fork_exec  # type: ignore[attr-defined]

    def interrupted_while_starting(*args: object) -> int:
        pid = fork_exec(*args)
        started.append(pid)
        signal.raise_signal(signal.SIGINT)  # Python raises it before Popen returns
        return pid

    monkeypatch.setattr(subprocess, "_fork_exec", interrupted_while_starting)
    env = {"RUNS": str(tmp_path / "runs"), "FAILS": "0", "FAILURE": ""}
    begun = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.run(["up", "--yes"], str(tmp_path), env)
        monkeypatch.undo()
        assert len(started) == 1
        assert not is_alive(started[0]), "the engine was left running"
        assert time.monotonic() - begun < 20  # stopped, not waited out
    finally:
        for pid in started:  # an engine left running is not left behind by the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    assert signal.getsignal(signal.SIGINT) is handler  # the caller's handler is back


def test_an_engine_command_given_the_version_found_runs_no_version_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``find_engine`` has read the version: the command checks that one instead of starting the
    engine again (a `pulumi version` run the fake engine would count), as the SDK would."""
    monkeypatch.delenv("PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK", raising=False)
    binary = tmp_path / "bin" / "pulumi"
    binary.parent.mkdir()
    binary.write_text(f"#!/bin/sh\necho started >> {tmp_path / 'starts'}\necho v3.259.0\n")
    binary.chmod(0o755)
    checked = EngineCommand(root=str(tmp_path), version="3.259.0")
    assert str(checked.version) == "3.259.0" and checked.command == str(binary)
    assert not (tmp_path / "starts").exists()
    with pytest.raises(InvalidVersionError, match="Major version mismatch"):
        EngineCommand(root=str(tmp_path), version="4.0.0")
    with pytest.raises(InvalidVersionError, match="Minimum version"):
        EngineCommand(root=str(tmp_path), version="3.0.0")
    assert str(EngineCommand(root=str(tmp_path)).version) == "3.259.0"  # reads it itself
    assert (tmp_path / "starts").read_text() == "started\n"
