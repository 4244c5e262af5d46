"""A budget is kept by the nodes when their client is gone: a SIGKILLed client's nodes stop
themselves at the deadline its budget set, on their own clocks, long before their ttl."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from skyward_iac.cli import main
from skyward_iac.infra.stacks.stack import ClusterStack
from tests.chaos.test_lifecycle_chaos import Child
from tests.helpers import stack_processes, stack_sandboxes

pytestmark = pytest.mark.chaos


def test_a_killed_clients_nodes_stop_at_the_budgets_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Two nodes at $3600/h each: $2 a second from their launch, so $80 is spent 40 s after it
    # (the test kills the client 11-15 s after the launch on a loaded machine: 15 s to spare
    # before the check below; every second more is a second the suite waits).
    budget, deadline, ttl = 80, 40.0, 300
    monkeypatch.setenv("SKYWARD_TEST_USD_PER_HOUR", "3600")
    monkeypatch.setenv("SKYWARD_TEST_MAX_COST", str(budget))
    child = Child(nodes=2, ttl=ttl, mode="idle")
    child.wait_for(r"^READY ")
    stack = child.stack
    assert stack is not None
    sandboxes = stack_sandboxes(stack)
    assert len(sandboxes) == 2
    # The budget counts from each node's launch (its resource created: its host key written,
    # on this machine's clock, as the test's): $1/s each, so spent 50 s after their mean.
    launches = [(node / "etc" / "ssh_host_ed25519_key").stat().st_mtime for node in sandboxes]
    started = time.monotonic() - (time.time() - sum(launches) / len(launches))
    # Each node was told the seconds the budget leaves: a duration, counted on its clock.
    told = [int((node / "work" / "budget").read_text()) for node in sandboxes]
    left = deadline - (time.monotonic() - started)
    assert all(left - 5 <= seconds <= deadline for seconds in told), (told, left)
    child.signal(signal.SIGKILL)
    child.finish(30)
    killed = time.monotonic() - started
    assert killed < deadline - 10, "the child took too long to start for this test"
    logs: dict[Path, str] = {}
    try:
        while stack_processes(stack) or stack_sandboxes(stack):
            for node in sandboxes:  # read while it exists: the log goes with the sandbox
                try:
                    logs[node] = (node / "log" / "watchdog.log").read_text()
                except OSError:
                    pass
            assert time.monotonic() - started < deadline + 60, (
                f"still running {deadline + 60:.0f}s after the child started:\n"
                + "\n".join(logs.values()))
            time.sleep(0.25)
        gone = time.monotonic() - started
        print(f"killed at {killed:.1f}s, nodes gone at {gone:.1f}s (budget deadline "
              f"{deadline:.0f}s after launch, ttl {ttl}s)")
        # Not before the deadline (the seconds told are rounded up), and long before the ttl
        # would have stopped them; a look of the watchdog (15 s at this ttl) and the stop late.
        assert deadline - 1 <= gone <= deadline + 45
        assert len(logs) == 2 and all("budget" in text for text in logs.values()), logs
    finally:
        if ClusterStack.select(stack).resource_count():
            main(["down", stack, "--force"])
