"""Every destroyer goes through the one destroy path (``infra/stacks/destroy.py``), with real
Local pools: each destroy's update message says ``skyward: destroyed by ACTOR: REASON`` and its
``ended`` tag records the status, the actor, the destroyer and the reason; a failed destroy is
recorded as such and left for gc. A pool's own close (heartbeat stopped before its connections
close) logs no heartbeat error."""

from __future__ import annotations

import getpass
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.infra.stacks import destroy, home
from skyward_iac.infra.stacks.records import PROJECT
from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.infra.stacks.tags import ended_of, process_started, stack_tags
from skyward_iac.orchestration import kernel_reaper
from skyward_iac.orchestration.plan import plan_pool
from tests.chaos.test_lifecycle_chaos import ROOT, wait_until_gone

pytestmark = pytest.mark.chaos
ME = f"{getpass.getuser()}@{socket.gethostname()}"


def record(stack: str) -> tuple[str, dict[str, str]]:
    """The stack's last update message and its ``ended`` tag."""
    handle = ClusterStack.select(stack)
    return handle.history()[0].message or "", ended_of(handle.tags())


def skyward_iac(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skyward_iac.cli", *args], check=False,
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


@sky.function
def hello() -> str:
    return "hello"


def test_a_pool_closed_normally_records_its_end_and_logs_no_heartbeat_error(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="skyward")
    # ttl 3: a beat every second, so beats run while the pool closes.
    compute = sky.Compute(provider=sky.Local(), nodes=1, ttl=3,
                          options=sky.Options(console=False, gc_on_start=False))
    with compute as pool:
        assert hello() >> pool == "hello"
        time.sleep(2.5)  # a few beats
    stack = compute.stack_name
    troubles = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("skyward")]
    assert not [m for m in troubles if "heartbeat" in m or "Socket" in m], troubles
    assert any("destroyed in" in r.getMessage() for r in caplog.records)
    message, ended = record(stack)
    assert message == f"skyward: destroyed by {ME}: pool closed"
    assert ended == {"status": "destroyed", "by": ME, "source": "self-declared", "via": "pool",
                     "reason": "pool closed"}


def orphan_stack() -> tuple[str, int, str]:
    """A real Local stack (one node, up, not bootstrapped) whose owner, a process of this
    machine, is gone, as a killed client or kernel leaves it: its name, and the owner's pid
    and start time."""
    plan = plan_pool([], None, sky.Options(console=False),
                     {"provider": sky.Local(), "nodes": 1, "ttl": 60})
    owner = subprocess.Popen(["sleep", "2"])
    started = process_started(owner.pid) or ""
    owner.wait()
    tags = {**stack_tags(plan.spec, 1), "pid": str(owner.pid), "pid_started": started}
    stack = ClusterStack.create(plan.request, tags)
    stack.up()
    return stack.name, owner.pid, started


def test_gc_and_a_dead_kernels_reaper_each_record_themselves() -> None:
    collected, _, _ = orphan_stack()
    reaped, kernel, started = orphan_stack()
    # The reaper of the "kernel" that owned one of them: it waits for its end (over), then
    # destroys the stacks it owned through the one path.
    assert kernel_reaper.main(["--pid", str(kernel), "--started", started]) == 0
    message, ended = record(reaped)
    reason = f"the Jupyter kernel (pid {kernel}) ended"
    assert message == f"skyward: destroyed by {ME}: {reason}"
    assert ended == {"status": "destroyed", "by": ME, "source": "self-declared",
                     "via": "kernel reaper", "reason": reason}
    assert ClusterStack.select(collected).resource_count() > 0  # not the reaper's
    done = skyward_iac("gc")
    assert done.returncode == 0, done.stderr
    assert f"{collected}: destroyed" in done.stdout and reaped not in done.stdout
    message, ended = record(collected)
    assert ended["via"] == "gc" and ended["by"] == ME and ended["status"] == "destroyed"
    assert ended["reason"].startswith("gc: its owner (") and "is gone" in ended["reason"]
    assert message == f"skyward: destroyed by {ME}: {ended['reason']}"
    for stack in (collected, reaped):
        wait_until_gone(stack, 30)


def test_the_pools_destroy_records_its_end_on_an_empty_stack_its_dead_engine_left_locked(
) -> None:
    """A Ctrl+C while the pool's ``up`` engine started killed it (SIGPIPE, see
    ``engine/command.py``) before it created anything: the stack is empty and locked by a dead
    process of this machine. The pool's destroy clears the lock (a refresh) and still records
    how the run ended: its destroy is the newest update and the ``ended`` tag is written.
    (It used to find the stack empty after the refresh and return ``already down``: the
    refresh was the run's last word and no end was recorded.)"""
    plan = plan_pool([], None, sky.Options(console=False),
                     {"provider": sky.Local(), "nodes": 1, "ttl": 60})
    stack = ClusterStack.create(plan.request, stack_tags(plan.spec, 1))
    engine = subprocess.Popen(["true"])
    engine.wait()
    backend = home.file_backend()
    assert backend is not None
    locks = backend / ".pulumi" / "locks" / "organization" / PROJECT / stack.name
    locks.mkdir(parents=True, exist_ok=True)
    (locks / f"{uuid.uuid4()}.json").write_text(json.dumps({  # as the engine writes it
        "pid": engine.pid, "username": getpass.getuser(), "hostname": socket.gethostname(),
        "timestamp": datetime.now(UTC).isoformat()}))
    assert stack.stale_locks()
    reason = "interrupted (Ctrl+C)"
    outcome = destroy.destroy(stack, destroy.Destroyer(destroy.POOL, reason, holds=True,
                                                       patience=30.0))
    assert outcome.status == destroy.DESTROYED, outcome
    assert record(stack.name) == (f"skyward: destroyed by {ME}: {reason}",
                                  {"status": "destroyed", "by": ME, "source": "self-declared",
                                   "via": "pool", "reason": reason})
    kinds = [update.kind for update in ClusterStack.select(stack.name).history()]
    assert kinds == ["destroy", "refresh"], kinds
    assert not stack.stale_locks()


def engine_destroying(stack: str) -> list[int]:
    """The engine processes running a ``destroy`` of ``stack`` now."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if command and command[0].endswith(b"/pulumi") and b"destroy" in command \
                and any(stack.encode() in part for part in command):
            found.append(int(proc.name))
    return found


def down_with_its_engine_killed(stack: str) -> subprocess.CompletedProcess[str]:
    """``skyward-iac down STACK --force`` whose engine dies (SIGKILL) as its destroy starts:
    a destroy that fails, as an engine crash or a machine lost mid-destroy makes it."""
    down = subprocess.Popen([sys.executable, "-m", "skyward_iac.cli", "down", stack, "--force",
                             "--reason", "load test over"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    killed = False
    while down.poll() is None:
        for pid in engine_destroying(stack):
            os.kill(pid, signal.SIGKILL)
            killed = True
        time.sleep(0.01)
    out, err = down.communicate()
    assert killed, (out, err)
    return subprocess.CompletedProcess(down.args, down.returncode, out, err)


def test_a_forced_down_is_recorded_and_a_failed_destroy_is_left_for_gc() -> None:
    compute = sky.Compute(provider=sky.Local(), nodes=1, ttl=30,
                          options=sky.Options(console=False, gc_on_start=False))
    with compute as pool:
        stack = pool.stack_name
        failed = down_with_its_engine_killed(stack)
        assert failed.returncode == 1, (failed.stdout, failed.stderr)
        handle = ClusterStack.select(stack)
        assert handle.resource_count() > 0  # left, for gc once its owner is gone
        ended = ended_of(handle.tags())
        assert ended["status"] == "destroy failed" and ended["error"] == "ProvisionError", ended
        assert ended["via"] == "down" and ended["by"] == ME
        gc = skyward_iac("gc")  # its owner (this process) runs: gc leaves it alone
        assert gc.returncode == 0 and stack not in gc.stdout, gc.stdout
        assert hello() >> pool == "hello"  # the pool still works

        # The dead engine's lock is cleared (its holder died on this machine) and it goes.
        forced = skyward_iac("down", stack, "--force", "--reason", "load test over")
        assert forced.returncode == 0, forced.stderr
        reason = "skyward-iac down --force: load test over"
        assert record(stack) == (f"skyward: destroyed by {ME}: {reason}",
                                 {"status": "destroyed", "by": ME, "source": "self-declared",
                                  "via": "down", "reason": reason})
    # The owner's own close found its stack taken down: the takedown's record stays.
    assert ended_of(ClusterStack.select(stack).tags())["via"] == "down"
    wait_until_gone(stack, 30)
