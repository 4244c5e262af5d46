"""One clock per decision, on real Local pools (issue 29, findings 2 and 6): a client whose clock
runs 120 s behind keeps a busy pool; 120 s ahead, its dead client's nodes still stop a ttl
later; and on the owner's own machine, ``ls`` and ``gc`` know a dead owner at once.

The client's skew is injected where it stamps its beats (tests/chaos/skewed_beats.py says why).
A collector whose clock runs ahead is in tests/integration/test_team_leases.py.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.infra.stacks.home import local_nodes_dir
from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.orchestration import heartbeat
from tests.agent_process import wait_until
from tests.chaos.skewed_beats import OLD_CLIENT, stamp_like_the_old_client
from tests.chaos.test_lifecycle_chaos import Child, skyward_iac, wait_until_gone

pytestmark = pytest.mark.chaos


def heartbeat_skew(workdir: Path) -> float:
    """How far the heartbeat file's mtime is from this machine's clock (positive: ahead)."""
    return (workdir / "heartbeat").stat().st_mtime - time.time()


def ls_row(stack: str) -> dict[str, object]:
    listed = skyward_iac("ls", "--json")
    assert listed.returncode == 0, listed.stderr
    return next(row for row in json.loads(listed.stdout) if row["stack"] == stack)


def test_a_client_clock_120s_behind_keeps_a_busy_ttl30_pool_for_45s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The must-show of issue 29: before, such a client's nodes stopped themselves again and
    again (every beat looked 120 s old to a watchdog with a 30 s ttl)."""
    monkeypatch.setattr(heartbeat, "_write_beat", stamp_like_the_old_client(-120))
    for owner, name, replacement in OLD_CLIENT:  # over SFTP for the pool's life, as it did
        monkeypatch.setattr(owner, name, replacement)
    seen: list[sky.Event] = []

    @sky.function
    def bump() -> int:
        time.sleep(0.05)
        return sky.counter("work").increment()

    with sky.Compute(provider=sky.Local(), nodes=2, ttl=30, on_event=seen.append,
                     options=sky.Options(console=False)) as pool:
        addresses = [n.address.private_address for n in pool.nodes]
        workdirs = [Path(n.address.workdir) for n in pool.nodes]
        done = 0
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            futures = [bump() > pool for _ in range(8)]
            done += len([future.result() for future in futures])
        assert done > 45  # busy the whole time
        print(f"\n{done} calls in 45 s, counter {pool.counter('work').value}")
        assert pool.counter("work").value == done
        assert [n.address.private_address for n in pool.nodes] == addresses
        for workdir in workdirs:  # the beats did carry a clock 120 s behind
            assert heartbeat_skew(workdir) < -100
    lost = [e for e in seen if isinstance(e, sky.InstancePreempted | sky.InstanceReplaced
                                          | sky.Error)]
    assert not lost, lost
    for workdir in workdirs:
        log = workdir.parent / "log" / "watchdog.log"
        assert not log.exists() or "shutting the node down" not in log.read_text()


def test_a_client_clock_120s_ahead_does_not_keep_its_dead_clients_nodes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a heartbeat stamped 120 s ahead kept the nodes 120 s + ttl after their client
    died; now they stop about a ttl after its last beat."""
    ttl = 6
    monkeypatch.setenv("SKYWARD_TEST_STAMP_SKEW", "120")
    child = Child(nodes=1, ttl=ttl, mode="idle")
    child.wait_for(r"^READY ")
    stack = child.stack
    assert stack is not None
    workdir = local_nodes_dir() / stack / "node-0" / "work"
    # The beats land with the client's clock ahead: the next one after the pool is ready (the
    # bootstrap's own ``touch`` of the file, with the node's clock, can be the latest so far).
    assert wait_until(lambda: heartbeat_skew(workdir) > 100, 5 * ttl), heartbeat_skew(workdir)
    child.signal(signal.SIGKILL)
    child.finish()
    gone_after = wait_until_gone(stack, timeout=ttl + 30)
    assert gone_after < 60, gone_after  # the old watchdog: 120 + ttl at least
    print(f"\nnodes gone {gone_after:.1f}s after the client died (ttl {ttl}s, beats 120 s ahead)")
    watchdog = (workdir.parent / "log" / "watchdog.log")
    assert not watchdog.exists() or "no heartbeat seen" in watchdog.read_text()
    done = skyward_iac("gc")
    assert done.returncode == 0, done.stdout + done.stderr
    assert ClusterStack.select(stack).resource_count() == 0


def test_ls_and_gc_know_a_dead_owner_on_this_host() -> None:
    """Finding 6: a dead owner on this same host was shown as "alive elsewhere" and gc
    collected nothing until its ttl (600 s here) ran out."""
    child = Child(nodes=1, ttl=600, mode="idle")
    child.wait_for(r"^READY ")
    stack = child.stack
    assert stack is not None
    row = ls_row(stack)
    assert row["owner_state"] == "running" and row["owner_running"] is True
    assert skyward_iac("gc").returncode == 0
    assert ClusterStack.select(stack).resource_count() > 0  # a live owner: left alone

    child.signal(signal.SIGKILL)
    child.finish()
    killed = time.monotonic()
    row = ls_row(stack)
    assert row["owner_state"] == "gone" and row["owner_running"] is False, row
    plain = skyward_iac("ls")
    assert re.search(rf"{stack}.*\(gone\)", plain.stdout), plain.stdout
    done = skyward_iac("gc", "--json")
    assert done.returncode == 0, done.stderr
    (action,) = [a for a in json.loads(done.stdout) if a["stack"] == stack]
    assert action["action"] == "destroyed" and "process of this machine" in action["reason"]
    wait_until_gone(stack, timeout=30)
    assert ClusterStack.select(stack).resource_count() == 0
    waited = time.monotonic() - killed
    assert waited < 120  # not the ttl of 600 s
    print(f"\nls said gone and gc destroyed the stack {waited:.1f}s after its owner died")
