"""The fence's shell command (orchestration/node.py ``fence_command``), run by real shells on
real processes: it kills the agent's process group and reports success once nothing of it
runs, even while the killed processes wait to be reaped (CI, 2026-11-26: a fence that found
the killed group's zombies for 5 s reported failure)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward_iac.orchestration.node import fence_command

#: A parent that starts the "agent" (a shell with a background child, in a session and process
#: group of its own) and never reaps it, as a container's init may not: once killed, the
#: agent stays a zombie until this parent ends.
NEVER_REAPS = """
import subprocess, sys, time
agent = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600"], start_new_session=True)
open(sys.argv[1], "w").write(str(agent.pid))
time.sleep(600)
"""
SHELLS = [shell for shell in ("sh", "bash", "dash") if shutil.which(shell)]


def state(pid: int) -> str | None:
    """The process's state letter (None: gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def group_members(group: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == group:
                members.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return members


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    (tmp_path / "run").mkdir()
    pid_file = tmp_path / "run" / "agent.pid"
    parent = subprocess.Popen([sys.executable, "-c", NEVER_REAPS, str(pid_file)])
    try:
        deadline = time.monotonic() + 10
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the agent never started"
            time.sleep(0.02)
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + 10
        while len(group_members(pid)) < 2:  # the shell and its background sleep
            assert time.monotonic() < deadline, "the agent's child never started"
            time.sleep(0.02)
        yield tmp_path, pid
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_fence_succeeds_once_the_group_is_killed_though_nobody_reaped_it(
        agent: tuple[Path, int], shell: str) -> None:
    workdir, pid = agent
    started = time.monotonic()
    done = subprocess.run([shell, "-c", fence_command(str(workdir))], capture_output=True, check=False,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 3  # not the 5 s of a fence that gives up
    assert state(pid) == "Z"  # killed, and still waiting for its parent
    assert all(state(member) in ("Z", None) for member in group_members(pid))


@pytest.mark.parametrize("shell", SHELLS)
def test_a_fence_without_an_agent_pid_succeeds_at_once(tmp_path: Path, shell: str) -> None:
    done = subprocess.run([shell, "-c", fence_command(str(tmp_path))], capture_output=True, check=False,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
