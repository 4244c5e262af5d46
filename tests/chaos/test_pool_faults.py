"""A pool over time and under faults, on real Local nodes: every way out of a ``with`` leaves
nothing; a pool outlives its ttl many times over; a dead head does not stop the destroy;
``skyward-iac down --force`` is not undone; calls nobody can take time out; a retried task
never runs beside its first attempt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.infra.stacks.home import local_nodes_dir
from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.processes import sandbox_processes, stop_sandbox
from tests.chaos.test_lifecycle_chaos import ROOT, Child, wait_until_gone
from tests.helpers import stack_processes, stack_sandboxes

pytestmark = pytest.mark.chaos


def assert_nothing_left(stack: str, timeout: float = 30) -> None:
    wait_until_gone(stack, timeout)
    assert ClusterStack.select(stack).resource_count() == 0
    assert not stack_processes(stack) and not stack_sandboxes(stack)


def events_of(seen: list[sky.Event], *kinds: type) -> list[sky.Event]:
    return [e for e in seen if isinstance(e, kinds)]


# ---- every exit path ------------------------------------------------------------------------

def test_an_exception_with_work_queued_and_cancelled_futures_destroys_the_stack() -> None:
    child = Child(nodes=2, ttl=600, mode="raise")
    assert child.finish() != 0
    assert any("the user's code failed with work queued" in line for line in child.lines)
    assert not any("InvalidStateError" in line for line in child.lines), child.lines[-30:]
    assert child.stack
    assert_nothing_left(child.stack)


def test_ctrl_c_with_work_queued_destroys_the_stack() -> None:
    child = Child(nodes=2, ttl=600, mode="queued")
    child.wait_for(r"^QUEUED")
    child.signal(signal.SIGINT)
    assert child.finish() != 0
    assert child.stack
    assert any("destroyed in" in line for line in child.lines), child.lines[-20:]
    assert_nothing_left(child.stack)
    assert "interrupted (Ctrl+C)" in (ClusterStack.select(child.stack).history()[0].message or "")


def test_a_normal_exit_with_cancelled_and_running_futures_destroys_the_stack() -> None:
    @sky.function
    def nap() -> None:
        time.sleep(3)

    with sky.Compute(provider=sky.Local(), nodes=1, options=sky.Options(console=False)) as pool:
        futures = [nap() > pool for _ in range(20)]
        for future in futures[1::2]:
            future.cancel()
        name = pool.stack_name
    assert all(f.done() for f in futures)
    assert_nothing_left(name)


def test_a_dead_head_does_not_stop_the_destroy() -> None:
    """etcd and sshd of the head killed: closing the collections fails, the stack still goes."""
    compute = sky.Compute(provider=sky.Local(), nodes=2, options=sky.Options(console=False))
    pool = compute.__enter__()
    name = pool.stack_name
    assert pool.dict("d").get("missing") is None  # the client's tunnel to etcd is open
    head = local_nodes_dir() / name / "node-0"
    for pid in sandbox_processes(head):
        os.kill(pid, signal.SIGKILL)
    try:
        compute.__exit__(None, None, None)
    except Exception:  # noqa: BLE001 - the first teardown error is raised after the destroy
        pass
    assert ClusterStack.select(name).resource_count() == 0
    assert_nothing_left(name)


# ---- time --------------------------------------------------------------------------------------

def test_a_pool_lives_many_ttls_doing_work_and_keeps_its_nodes_and_collections() -> None:
    ttl, periods = 6, 6
    seen: list[sky.Event] = []

    @sky.function
    def bump() -> int:
        return sky.counter("work").increment()

    with sky.Compute(provider=sky.Local(), nodes=2, ttl=ttl, on_event=seen.append,
                     options=sky.Options(console=False)) as pool:
        addresses = [n.address.private_address for n in pool.nodes]
        pool.dict("kept")["key"] = "value"
        done = 0
        deadline = time.monotonic() + ttl * periods
        while time.monotonic() < deadline:
            done += len(bump() @ pool)
            time.sleep(1)
        assert pool.counter("work").value == done
        assert pool.dict("kept")["key"] == "value"
        assert [n.address.private_address for n in pool.nodes] == addresses
        assert not events_of(seen, sky.InstancePreempted, sky.InstanceReplaced, sky.Error)


# ---- a stack taken down from outside ----------------------------------------------------------

def test_down_force_of_a_live_pool_is_not_undone_and_its_exit_leaks_nothing() -> None:
    seen: list[sky.Event] = []

    @sky.function
    def ping() -> int:
        return 1

    options = sky.Options(console=False, default_compute_timeout=15)
    with sky.Compute(provider=sky.Local(), nodes=2, on_event=seen.append,
                     options=options) as pool:
        name = pool.stack_name
        down = subprocess.run([sys.executable, "-m", "skyward_iac.cli", "down", name, "--force"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT,
                              stdin=subprocess.DEVNULL)
        assert down.returncode == 0, down.stderr
        deadline = time.monotonic() + 20
        while not any(isinstance(e, sky.Error) and e.fatal for e in seen):
            assert time.monotonic() < deadline, [type(e).__name__ for e in seen][-20:]
            time.sleep(0.2)
        time.sleep(3)  # long enough for a replacement to have started, were there one
        assert ClusterStack.select(name).resource_count() == 0
        with pytest.raises(sky.NodeConnectionError):
            ping() >> pool
    assert_nothing_left(name)
    assert "taken down by" in " ".join(e.message for e in events_of(seen, sky.Error))


# ---- calls nobody can take ------------------------------------------------------------------------

def test_calls_time_out_with_a_clear_error_when_every_node_is_lost_and_replacement_fails(
        tmp_path: Path) -> None:
    marker = tmp_path / "no-more-nodes"
    # Replacements fail their bootstrap once the marker exists (the first nodes do not).
    plugin = sky.plugins.Plugin.create("fail-later").with_bootstrap(
        lambda cluster: (f"[ ! -e {marker} ] || {{ echo refusing; exit 1; }}",))
    seen: list[sky.Event] = []

    @sky.function(timeout=8)
    def ping() -> int:
        return 1

    options = sky.Options(console=False, provision_retry_delay=0.5, max_provision_attempts=3)
    with sky.Compute(provider=sky.Local(), nodes=1, plugins=[plugin], on_event=seen.append,
                     options=options) as pool:
        assert (ping() >> pool) == 1
        marker.touch()
        stop_sandbox(local_nodes_dir() / pool.stack_name / "node-0")
        started = time.monotonic()
        with pytest.raises(sky.NodeConnectionError, match="no node|out of service|lost"):
            ping() >> pool
        assert time.monotonic() - started < 60
        deadline = time.monotonic() + 60
        while len([e for e in events_of(seen, sky.Error) if "failed to start" in e.message]) < 2:
            assert time.monotonic() < deadline, "the replacement was not retried"
            time.sleep(0.2)
        name = pool.stack_name
    assert_nothing_left(name)


# ---- a retried task and its first attempt ------------------------------------------------------

def test_a_retried_task_never_runs_beside_its_first_attempt(tmp_path: Path) -> None:
    ticks = tmp_path / "ticks"

    @sky.function
    def ticking() -> str:
        """Write a line every 50 ms for 4 s: two attempts at once would interleave."""
        with open(ticks, "a") as out:
            for _ in range(80):
                out.write(f"{os.getpid()} {time.time():.3f}\n")
                out.flush()
                time.sleep(0.05)
        return "done"

    with sky.Compute(provider=sky.Local(), nodes=2,
                     options=sky.Options(console=False)) as pool:
        future = ticking() > pool
        deadline = time.monotonic() + 30
        while not ticks.exists() or not ticks.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        first_pid = int(ticks.read_text().split()[0])
        node = next(n for n in pool.nodes
                    if first_pid in sandbox_processes(Path(n.address.workdir).parent))
        agent_pid = int((Path(node.address.workdir) / "run" / "agent.pid").read_text())
        time.sleep(0.5)
        os.kill(agent_pid, signal.SIGKILL)  # the agent dies; its worker must not run on
        assert future.result(timeout=120) == "done"
    lines = [line.split() for line in ticks.read_text().splitlines()]
    by_pid: dict[str, list[float]] = {}
    for pid, at in lines:
        by_pid.setdefault(pid, []).append(float(at))
    assert len(by_pid) == 2, by_pid.keys()
    first, retry = (by_pid[str(first_pid)],
                    next(v for k, v in by_pid.items() if k != str(first_pid)))
    assert max(first) < min(retry), "the retry ran while its first attempt still ticked"
    assert len(retry) == 80
