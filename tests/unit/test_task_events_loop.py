"""A pool's task events through a real agent: counting a succeeded call runs on the wire loop
(no hand-off to another thread) only when that is all there is to do; every event a subscriber
asked for still comes, off the loop, and every call is counted once."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from skyward_iac.node import protocol
from skyward_iac.observability import events as ev
from skyward_iac.observability.bus import EventBus
from skyward_iac.orchestration.dispatch import Call
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.orchestration.task_events import TaskEvents
from skyward_iac.remote.agent_client import AgentClient
from skyward_iac.remote.callback_lanes import done_on_loop
from tests.agent_process import TOKEN, running_agent

CALLS = 20


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with running_agent(tmp_path_factory.mktemp("agent"), "--concurrency", "1",
                       "--node", "0") as started:
        yield started.port


def _run(agent: int, events: TaskEvents, fail_every: int = 0) -> list[Future[Any]]:
    """``CALLS`` sequential calls through ``events`` as the dispatcher makes them."""
    client = AgentClient(socket.create_connection(("127.0.0.1", agent)), TOKEN, node=0)
    client.on_started = events.started
    futures = []
    try:
        for i in range(CALLS):
            failing = fail_every and i % fail_every == 0
            payload = protocol.dumps((int, ("x" if failing else str(i),), {}))
            call = Call(i + 1, "int", payload, 30.0)
            events.watch([call])
            client.submit_many([call])
            events.changed()
            futures.append(call.future)
            try:
                call.future.result(30)
            except ValueError:
                pass
    finally:
        client.close()
    # A call's done-callbacks may still be running off the loop when its result is read: wait
    # (bounded) until every call is accounted for.
    deadline = time.monotonic() + 30
    while events._watched and time.monotonic() < deadline:
        time.sleep(0.005)
    events.flush()
    return futures


def _where_counted(events: TaskEvents) -> list[str]:
    """The threads ``events`` counted succeeded calls on, without a hand-off."""
    threads: list[str] = []
    counted = events._counted

    def recording(future: Future[Any]) -> bool:
        done = counted(future)
        if done:
            threads.append(threading.current_thread().name)
        return done

    events._counted = recording  # type: ignore[method-assign]
    return threads


def test_a_summary_listener_s_counting_runs_on_the_wire_loop(agent: int) -> None:
    bus = EventBus()
    got: list[ev.Event] = []
    bus.subscribe(got.append, summary=True)  # as a console does
    events = TaskEvents(PoolIdentity("s"), bus, lambda: (0, 0))
    on_loop = _where_counted(events)
    _run(agent, events, fail_every=5)
    assert events.tally.succeeded == CALLS - CALLS // 5 and events.tally.failed == CALLS // 5
    assert on_loop and set(on_loop) == {"skyward-wire"}
    failures = [e for e in got if isinstance(e, ev.TaskCompleted)]
    assert len(failures) == CALLS // 5 and not any(f.success for f in failures)
    assert isinstance(got[-1], ev.TaskProgress)
    assert (got[-1].succeeded, got[-1].failed) == (CALLS - CALLS // 5, CALLS // 5)
    assert not events._watched


def test_per_task_listeners_get_every_event_off_the_loop(agent: int) -> None:
    bus = EventBus()
    got: list[tuple[ev.Event, str]] = []
    bus.subscribe(lambda e: got.append((e, threading.current_thread().name)))
    events = TaskEvents(PoolIdentity("s"), bus, lambda: (0, 0))
    on_loop = _where_counted(events)
    _run(agent, events)
    assert on_loop == []
    kinds = [type(e).__name__ for e, _ in got if not isinstance(e, ev.TaskProgress)]
    assert kinds.count("TaskQueued") == kinds.count("TaskStarted") == CALLS
    assert kinds.count("TaskCompleted") == CALLS
    assert all(thread != "skyward-wire" for _, thread in got)
    assert events.tally.succeeded == CALLS and not events._watched


def test_bookkeeping_runs_first_and_a_user_callback_keeps_its_place() -> None:
    bus = EventBus()
    bus.subscribe(print, summary=True)
    events = TaskEvents(PoolIdentity("s"), bus, lambda: (0, 0))
    events.tally.interval = 3600
    events.changed()
    events.flush()  # reported now: the next report is an hour away
    events.changed()  # a report is scheduled: counting starts nothing
    seen: list[str] = []

    def user(future: Future[Any]) -> None:
        seen.append("user")

    first, second = Future[Any](), Future[Any]()
    for future in (first, second):
        future.set_result(1)
        events._watched[future] = Call(1, "f", b"", None)
    assert done_on_loop(first, [events._done, user]) == [user]
    # A user callback registered first: nothing runs ahead of it.
    assert done_on_loop(second, [user, events._done]) == [user, events._done]
    assert events.tally.succeeded == 1 and seen == []
    events.flush()
    # No report scheduled: counting would start a timer thread, so it is not done here.
    third = Future[Any]()
    third.set_result(1)
    events._watched[third] = Call(2, "f", b"", None)
    assert not events._done.done_on_loop(third) and third in events._watched
