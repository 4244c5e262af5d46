"""A Local node's life is its processes': alive while any runs, all stopped when it goes, and
stopping by itself from the moment it exists."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.infra.stacks.home import local_nodes_dir
from skyward_iac.infra.stacks.stack import ClusterStack
from tests.chaos.test_lifecycle_chaos import Child, skyward_iac, wait_until_gone
from tests.helpers import stack_processes, stack_sandboxes

pytestmark = pytest.mark.chaos
MARKER = "987654.25"


def marked_processes() -> list[int]:
    """Processes whose command line is ``sleep MARKER``."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", MARKER.encode()]:
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@sky.function
def escape() -> int:
    """Leave the node's sandbox every way a process can: a double fork into a new session,
    working directory /, an empty environment."""
    subprocess.run(["sh", "-c", f"cd / && env -i setsid sleep {MARKER} </dev/null >/dev/null "
                    "2>&1 &"], check=True)
    time.sleep(0.5)
    return len(marked_processes())


def test_a_task_that_double_forks_into_a_new_session_is_stopped_with_its_node() -> None:
    assert not marked_processes()
    with sky.Compute(provider=sky.Local(), nodes=1, options=sky.Options(console=False)) as pool:
        assert (escape() >> pool) == 1
        assert marked_processes()
    deadline = time.monotonic() + 10
    while marked_processes():
        assert time.monotonic() < deadline, "the escaped process outlived the destroy"
        time.sleep(0.1)


def test_a_node_whose_sshd_died_is_kept_until_its_processes_are_stopped() -> None:
    child = Child(nodes=1, ttl=600, mode="idle")
    child.wait_for(r"READY ")
    stack = child.stack
    assert stack is not None
    child.signal(signal.SIGKILL)
    child.finish()
    sandbox = local_nodes_dir() / stack / "node-0"
    sshd = int((sandbox / "run" / "sshd.pid").read_text())
    agent = int((sandbox / "work" / "run" / "agent.pid").read_text())
    os.kill(sshd, signal.SIGKILL)
    time.sleep(0.5)
    assert stack_processes(stack), "the node's agent and etcd still run"

    ClusterStack.select(stack).clear_crash_leftovers()  # refresh: the node is still alive
    assert ClusterStack.select(stack).resource_count() > 0
    done = skyward_iac("down", stack, "--force")
    assert done.returncode == 0, done.stdout + done.stderr
    wait_until_gone(stack, timeout=30)
    assert not Path(f"/proc/{agent}").exists() or b"Z" in Path(f"/proc/{agent}/stat").read_bytes()


def test_a_client_killed_during_up_leaves_nodes_that_stop_by_their_ttl(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The nodes' first-contact grace: 8 s instead of the default 30 (the suite waits it out).
    ttl, grace = 4, 8
    monkeypatch.setenv("SKYWARD_TEST_FIRST_CONTACT", str(grace))
    child = Child(nodes=2, ttl=ttl, mode="idle")
    child.wait_for(r"node 1: provisioned|create node-1")
    stack = child.stack
    assert stack is not None
    child.signal(signal.SIGKILL)  # before any bootstrap: no heartbeat ever reaches the nodes
    child.finish()
    # Each node's watchdog (started with it) says the grace it was given; read while it exists.
    logs: dict[str, str] = {}
    started = time.monotonic()
    while stack_processes(stack) or stack_sandboxes(stack):
        for log in (local_nodes_dir() / stack).glob("node-*/log/watchdog.log"):
            with contextlib.suppress(OSError):
                logs[log.parent.parent.name] = log.read_text()
        assert time.monotonic() - started < max(grace, ttl) + ttl + 30, logs
        time.sleep(0.25)
    assert logs and all(f"({grace}s before the first)" in text for text in logs.values()), logs
    done = skyward_iac("gc")  # the owner is dead: its stack is emptied
    assert done.returncode == 0, done.stdout + done.stderr
    assert ClusterStack.select(stack).resource_count() == 0
