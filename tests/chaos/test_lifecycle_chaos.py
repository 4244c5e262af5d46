"""Nothing leaks, whatever happens to the client: kill -9, Ctrl+C in every phase, two gcs."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from skyward_iac.cli import main
from skyward_iac.infra.stacks.stack import ClusterStack
from tests.helpers import stack_processes, stack_sandboxes, stored_resource_count

pytestmark = pytest.mark.chaos
CHILD = Path(__file__).with_name("child_pool.py")
ROOT = Path(__file__).resolve().parents[2]


class Child:
    """A child client process whose stderr (the skyward log) is read line by line."""

    #: Every child started by this process, for ``kill_the_left_over`` after each test.
    started: ClassVar[list[Child]] = []

    def __init__(self, nodes: int, ttl: int, mode: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(CHILD), str(nodes), str(ttl), mode], cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.lines: list[str] = []
        self.stack: str | None = None
        Child.started.append(self)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if found := re.search(r"(local-[A-Za-z0-9_.-]+-\d{8}-\d{6}-[0-9a-f]{6})", line):
                self.stack = self.stack or found.group(1)

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(re.search(pattern, line) for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never saw {pattern!r}:\n" + "\n".join(self.lines[-30:]))
            time.sleep(0.02)

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def finish(self, timeout: float = 180) -> int:
        return self.process.wait(timeout)

    @classmethod
    def kill_the_left_over(cls, grace: float = 0) -> list[str]:
        """Kill every child still running after ``grace`` seconds (a test that failed before it
        ended its child) and take its stack down; the stacks of the children left running."""
        deadline = time.monotonic() + grace
        while any(c.process.poll() is None for c in cls.started) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [child for child in cls.started if child.process.poll() is None]
        cls.started.clear()
        for child in left:
            child.signal(signal.SIGKILL)
            child.finish(30)
            if child.stack and ClusterStack.select(child.stack).resource_count():
                main(["down", child.stack, "--force"])
        return [child.stack or f"pid {child.process.pid}" for child in left]


@contextlib.contextmanager
def holding_pool(nodes: int, ttl: int) -> Iterator[Child]:
    """A child process holding a Local pool of ``nodes`` open (``idle``) for the block; killed
    after it, and its stack taken down if the block left it up."""
    child = Child(nodes=nodes, ttl=ttl, mode="idle")
    try:
        child.wait_for(r"^READY ")
        assert child.stack is not None
        yield child
    finally:
        child.signal(signal.SIGKILL)
        child.finish(30)
        if child.stack and ClusterStack.select(child.stack).resource_count():
            main(["down", child.stack, "--force"])


def wait_until_gone(stack: str, timeout: float) -> float:
    """Seconds until no process or sandbox of ``stack`` is left (fails after ``timeout``)."""
    started = time.monotonic()
    while stack_processes(stack) or stack_sandboxes(stack):
        if time.monotonic() - started > timeout:
            raise AssertionError(f"still there after {timeout}s: pids {stack_processes(stack)}, "
                                 f"sandboxes {stack_sandboxes(stack)}")
        time.sleep(0.25)
    return time.monotonic() - started


def skyward_iac(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skyward_iac.cli", *args], check=False,
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          stdin=subprocess.DEVNULL)


def test_sigkill_of_the_client_nodes_stop_themselves_within_ttl_and_gc_empties_the_stack() -> None:
    ttl = 6
    child = Child(nodes=2, ttl=ttl, mode="idle")
    child.wait_for(r"^READY ")
    stack = child.stack
    assert stack and stack_processes(stack)
    child.signal(signal.SIGKILL)
    child.finish()
    gone_after = wait_until_gone(stack, timeout=ttl + 20)
    assert gone_after <= ttl + 20
    assert ClusterStack.select(stack).resource_count() > 0  # the stack still lists them
    done = skyward_iac("gc")
    assert done.returncode == 0, done.stderr
    assert f"{stack}: destroyed" in done.stdout
    assert ClusterStack.select(stack).resource_count() == 0
    again = skyward_iac("gc")  # idempotent
    assert again.returncode == 0 and stack not in again.stdout


@pytest.mark.parametrize(("mode", "marker", "again"), [
    ("idle", r"bringing up", ()),              # during `pulumi up`
    ("idle", r"node \d: bootstrap", ()),        # while nodes bootstrap
    ("idle", r"^READY ", ()),                  # between tasks
    ("task", r"^READY ", ()),                  # while a task runs
    ("task", r"^READY ", (0.3, 1.0, 2.0)),     # and again, and again, while it tears down
])
def test_ctrl_c_leaves_nothing_behind(mode: str, marker: str, again: tuple[float, ...]) -> None:
    child = Child(nodes=2, ttl=600, mode=mode)
    child.wait_for(marker)
    if mode == "task":
        time.sleep(1)  # the task is running now
    child.signal(signal.SIGINT)
    for delay in again:
        time.sleep(delay)
        if child.process.poll() is None:
            child.signal(signal.SIGINT)
    # Always the same status: a Python script Ctrl+C ended dies by SIGINT (130 in a shell).
    assert child.finish() == -signal.SIGINT, "\n".join(child.lines[-20:])
    stack = child.stack
    assert stack
    assert any("destroyed in" in line for line in child.lines), "\n".join(child.lines[-20:])
    wait_until_gone(stack, timeout=10)
    assert ClusterStack.select(stack).resource_count() == 0
    assert "interrupted (Ctrl+C)" in (ClusterStack.select(stack).history()[0].message or "")


def test_a_collector_whose_listing_predates_the_owners_destroy_keeps_the_owners_record(
) -> None:
    """gc lists the stacks, then judges each owner as it comes to it (seconds later, after
    other stacks' destroys): a pool that closed itself in between is judged gone while gc's
    listing still shows its resources. gc leaves it (``already down``): the owner's destroy
    stays the last update and its ``ended`` tag stays the owner's (gc refreshed and destroyed
    the empty stack again, recording itself as the run's end)."""
    from skyward_iac.infra.stacks import destroy
    from skyward_iac.infra.stacks.owners import look
    from skyward_iac.infra.stacks.stack import list_records
    from skyward_iac.infra.stacks.tags import ended_of

    child = Child(nodes=1, ttl=600, mode="idle")
    child.wait_for(r"^READY ")
    stack = child.stack
    assert stack
    listed = [r for r in list_records(only_live=True) if r.name == stack]
    assert listed and listed[0].resource_count > 0
    child.signal(signal.SIGINT)
    assert child.finish() == -signal.SIGINT, "\n".join(child.lines[-20:])
    outcome = destroy.destroy(stack, destroy.Destroyer(destroy.GC, "gc: its owner is gone"),
                              seen=(listed[0], look(listed)))
    assert outcome.status == destroy.ALREADY_DOWN, outcome
    handle = ClusterStack.select(stack)
    assert "interrupted (Ctrl+C)" in (handle.history()[0].message or "")
    assert ended_of(handle.tags())["via"] == "pool"


def test_a_down_whose_owner_ends_its_pool_while_it_is_judged_keeps_the_owners_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``down`` (and the kernel reaper) read the stack's count, then its tags, then judge the
    owner: a pool that closed itself in that second was judged gone with resources counted,
    and ``down`` destroyed the empty stack again, recording itself as the run's end. Here the
    owner ends its pool exactly there."""
    from skyward_iac.infra.stacks import destroy
    from skyward_iac.infra.stacks.tags import ended_of

    child = Child(nodes=1, ttl=600, mode="idle")
    child.wait_for(r"^READY ")
    stack = child.stack
    assert stack
    judge = destroy.owners.look

    def owner_ends_first(records: list[object]) -> object:
        child.signal(signal.SIGINT)
        assert child.finish() == -signal.SIGINT, "\n".join(child.lines[-20:])
        return judge(records)

    monkeypatch.setattr(destroy.owners, "look", owner_ends_first)
    outcome = destroy.destroy(stack, destroy.Destroyer(destroy.DOWN, "down: by hand"))
    assert outcome.status == destroy.ALREADY_DOWN, outcome
    handle = ClusterStack.select(stack)
    assert "interrupted (Ctrl+C)" in (handle.history()[0].message or "")
    assert ended_of(handle.tags())["via"] == "pool"


def test_ctrl_c_during_destroy_leaves_a_state_gc_finishes() -> None:
    child = Child(nodes=2, ttl=5, mode="exit")
    child.wait_for(r"destroying")
    child.signal(signal.SIGINT)
    child.finish()
    stack = child.stack
    assert stack
    time.sleep(6)  # past the ttl: whatever the interrupted destroy left is now collectable
    done = skyward_iac("gc")
    assert done.returncode == 0, done.stdout + done.stderr
    wait_until_gone(stack, timeout=30)
    assert ClusterStack.select(stack).resource_count() == 0


def test_two_collectors_at_once_are_safe() -> None:
    child = Child(nodes=1, ttl=4, mode="idle")
    child.wait_for(r"^READY ")
    stack = child.stack
    assert stack
    child.signal(signal.SIGKILL)
    child.finish()
    wait_until_gone(stack, timeout=30)
    results: list[subprocess.CompletedProcess[str]] = []
    threads = [threading.Thread(target=lambda: results.append(skyward_iac("gc")))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r.returncode == 0 for r in results), [r.stdout + r.stderr for r in results]
    assert ClusterStack.select(stack).resource_count() == 0
    outputs = "\n".join(r.stdout for r in results)
    assert outputs.count(f"{stack}: destroyed") == 1


def test_history_lists_destroyed_runs_with_how_they_ended() -> None:
    done = skyward_iac("history", "--json", "--limit", "200")
    assert done.returncode == 0, done.stderr
    import json

    runs = json.loads(done.stdout)
    endings = {run["ended"] for run in runs}
    # Each destroy says who ended the run and why (the one destroy path).
    assert any(re.fullmatch(r"skyward: destroyed by \S+: interrupted \(Ctrl\+C\)", e)
               for e in endings), endings
    assert any(re.fullmatch(r"skyward: destroyed by \S+: gc: .+", e) for e in endings), endings
    assert all(run["live_resources"] == 0 for run in runs if run["ended"].startswith("skyward"))


def test_a_node_killed_during_a_map_is_replaced_and_every_result_is_right() -> None:
    import skyward_iac as sky
    from skyward_iac.infra.stacks.home import local_nodes_dir
    from skyward_iac.processes import stop_sandbox

    def slow_square(x: int) -> int:
        import time

        time.sleep(0.15)
        return x * x

    seen: list[object] = []
    with sky.Compute(provider=sky.Local(), nodes=2, on_event=seen.append,
                     options=sky.Options(worker=sky.Worker(concurrency=2))) as pool:
        replaced = threading.Event()
        pool.on(sky.InstanceReplaced, lambda event: replaced.set())
        victim = local_nodes_dir() / pool.stack_name / "node-1"
        old_address = pool.nodes[1].address.private_address
        # Reclaim node 1 from outside (as a spot interruption would) while the map runs.
        killer = threading.Timer(1.0, stop_sandbox, args=(victim,))
        killer.start()
        results = pool.map(slow_square, range(50))
        killer.join()
        assert results == [x * x for x in range(50)]
        assert replaced.wait(120), "node 1 was never replaced"
        assert pool.nodes[1].address.private_address != old_address
        assert pool.run(sky.function(slow_square)(7), target=1) == 49  # the new node serves
        kinds = [type(e).__name__ for e in seen]
        assert "InstancePreempted" in kinds and "InstanceReplaced" in kinds
        info = pool.run(sky.function(lambda: sky.instance_info().peers)(), target=0)
        assert info[1].private_ip == pool.nodes[1].address.private_address  # peers were updated


def test_an_elastic_pool_grows_under_a_burst_and_shrinks_when_idle() -> None:
    import skyward_iac as sky

    def nap(seconds: float) -> int:
        import time

        time.sleep(seconds)
        return sky.instance_info().total_nodes  # type: ignore[union-attr]

    options = sky.Options(autoscale_cooldown=0.5, autoscale_idle_timeout=2,
                          reconcile_tick_interval=0.3)
    with sky.Compute(provider=sky.Local(), nodes=sky.Nodes(desired=1, max=3),
                     options=options) as pool:
        assert pool.current_nodes() == 1
        sizes: list[int] = []
        sampler_done = threading.Event()

        def sample() -> None:
            while not sampler_done.is_set():
                sizes.append(pool.current_nodes())
                time.sleep(0.1)

        # A daemon: when an assertion below fails, the sampler is never told to stop, and
        # a thread that samples forever kept the failed test's process from exiting.
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        totals = pool.map(lambda _: nap(1.5), range(12))
        assert max(sizes) == 3, sizes
        assert max(totals) == 3  # tasks saw the grown pool through instance_info
        deadline = time.monotonic() + 60
        while pool.current_nodes() > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        sampler_done.set()
        sampler.join()
        assert pool.current_nodes() == 1, "the idle pool did not shrink to its floor"
        # Nodes leave service first; the stack update that deletes them follows.
        while stored_resource_count(pool.stack_name) != 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ClusterStack.select(pool.stack_name).resource_count() == 3  # creds, pki, 1 node
        stack = pool.stack_name
    kinds = [u.message for u in ClusterStack.select(stack).history()]
    assert any("resize 1 -> 3" in (m or "") or "resize 1 -> 2" in (m or "") for m in kinds), kinds
    assert any("-> 1 nodes" in (m or "") for m in kinds), kinds
