"""Task events on a real Local pool: every call is queued, started by a node, completed."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import skyward_iac as sky


@sky.function
def square(x: int) -> int:
    time.sleep(0.01)
    return x * x


@sky.function
def fail(message: str) -> None:
    raise ValueError(message)


class Recorder:
    """Task events by task id, in the order the pool emitted them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_task: dict[int, list[sky.Event]] = defaultdict(list)

    def __call__(self, event: sky.Event) -> None:
        with self.lock:
            self.by_task[event.task_id].append(event)  # type: ignore[attr-defined]

    def wait_completed(self, count: int, timeout: float = 10.0) -> dict[int, list[sky.Event]]:
        """Completion callbacks run in reader threads: wait until ``count`` tasks completed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                done = [t for t, events in self.by_task.items()
                        if isinstance(events[-1], sky.TaskCompleted)]
                if len(done) >= count:
                    return dict(self.by_task)
            time.sleep(0.02)
        raise AssertionError(f"only {len(done)} of {count} tasks completed: {self.by_task}")


def test_every_task_is_queued_started_and_completed_in_order(pool: sky.Pool) -> None:
    recorder = Recorder()
    subscriptions = [pool.on(kind, recorder)
                     for kind in (sky.TaskQueued, sky.TaskStarted, sky.TaskCompleted)]
    try:
        results = [future.result() for future in [square(x) > pool for x in range(12)]]
        events = recorder.wait_completed(12)
    finally:
        for subscription in subscriptions:
            subscription.cancel()
    assert results == [x * x for x in range(12)]
    assert len(events) == 12
    nodes_used = set()
    for task_id, sequence in events.items():
        assert [type(e) for e in sequence] == [sky.TaskQueued, sky.TaskStarted, sky.TaskCompleted]
        queued, started, completed = sequence
        assert queued.name == started.name == completed.name == "square"
        assert started.node == completed.node in (0, 1)
        assert completed.success and completed.error is None
        # The task sleeps 10 ms on the node; its duration is measured from the node's start.
        assert 0.01 <= completed.duration < 5
        assert queued.timestamp <= started.timestamp <= completed.timestamp
        assert started.stack == pool.stack_name
        nodes_used.add(started.node)
    assert nodes_used == {0, 1}  # round-robin over both nodes


def test_a_failed_task_completes_with_its_error(pool: sky.Pool) -> None:
    recorder = Recorder()
    subscription = pool.on(sky.Event, lambda e: recorder(e) if hasattr(e, "task_id") else None)
    try:
        try:
            fail("boom") >> pool
        except ValueError:
            pass
        else:
            raise AssertionError("the remote ValueError was not raised")
        events = recorder.wait_completed(1)
    finally:
        subscription.cancel()
    [sequence] = events.values()
    completed = sequence[-1]
    assert isinstance(completed, sky.TaskCompleted)
    assert not completed.success
    assert completed.error is not None and "ValueError: boom" in completed.error
    assert isinstance(sequence[1], sky.TaskStarted) and sequence[1].node == completed.node


@sky.function
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_a_long_task_is_reported_started_while_it_runs(pool: sky.Pool) -> None:
    """Short tasks' starts travel with their results; a long one's within ~0.1 s of starting."""
    recorder = Recorder()
    subscriptions = [pool.on(kind, recorder) for kind in (sky.TaskStarted, sky.TaskCompleted)]
    try:
        assert (nap(1.0) >> pool) == 1.0
        events = recorder.wait_completed(1)
    finally:
        for subscription in subscriptions:
            subscription.cancel()
    [(started, completed)] = events.values()
    assert isinstance(started, sky.TaskStarted) and isinstance(completed, sky.TaskCompleted)
    assert completed.timestamp - started.timestamp > 0.7, "started was reported only at the end"
    assert 1.0 <= completed.duration < 1.5


def test_a_summary_subscriber_gets_counts_and_failures_but_no_per_task_events(
        pool: sky.Pool) -> None:
    """What a console sees: TaskProgress a few times a second (the last one final), failures,
    and none of the per-task events, which the pool then does not build at all."""
    got: list[sky.Event] = []
    subscription = pool.events.subscribe(got.append, summary=True)
    try:
        assert not pool.events.task_detail, "only summary subscribers (the console) listen"
        before = (pool._dispatcher.events.tally.succeeded, pool._dispatcher.events.tally.failed)
        assert pool.map(square, range(200)) == [x * x for x in range(200)]
        try:
            fail("boom") >> pool
        except ValueError:
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            progress = [e for e in got if isinstance(e, sky.TaskProgress)]
            if progress and (progress[-1].succeeded, progress[-1].failed) == (
                    before[0] + 200, before[1] + 1):
                break
            time.sleep(0.05)
    finally:
        subscription.cancel()
    assert not any(isinstance(e, sky.TaskQueued | sky.TaskStarted) for e in got)
    [failed] = [e for e in got if isinstance(e, sky.TaskCompleted)]
    assert not failed.success and "ValueError: boom" in (failed.error or "")
    assert progress[-1] == sky.TaskProgress(pool.stack_name, 0, 0, before[0] + 200,
                                            before[1] + 1)
    assert all(e.stack == pool.stack_name for e in progress)
    # 200 tasks of 10 ms on 2 nodes take about a second: a handful of reports, not hundreds.
    assert 2 <= len(progress) <= 30, len(progress)
    gaps = [b.timestamp - a.timestamp for a, b in zip(progress, progress[1:], strict=False)]
    assert min(gaps) >= 0.2, gaps


@sky.function
def chatty(tag: str) -> str:
    import sys

    print(f"hello from {tag}")
    print(f"second line of {tag}")
    print(f"oops from {tag}", file=sys.stderr)
    return tag


def test_task_output_reaches_subscribers_as_log_events(pool: sky.Pool) -> None:
    logs: list[sky.Log] = []
    subscription = pool.on(sky.Log, logs.append)
    try:
        assert chatty("t1") >> pool == "t1"
        deadline = time.monotonic() + 10
        while len([e for e in logs if "t1" in e.line]) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        subscription.cancel()
    lines = {(e.stream, e.line) for e in logs if e.node is not None}
    assert ("stdout", "hello from t1") in lines and ("stdout", "second line of t1") in lines
    assert ("stderr", "oops from t1") in lines
    assert all(e.stack == pool.stack_name for e in logs)
    assert not pool.events.listens(sky.Log)  # nobody listens now: no events are built
