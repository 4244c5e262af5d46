"""The pool's failure paths with fake agents (no SSH, no engine): cancelled and duplicate
futures at close, a send failure racing the reader, retries never placed on a lost node,
retries counted once, calls nobody can take failing after their timeout."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import NodeConnectionError
from skyward_iac.node import protocol
from skyward_iac.node.messages import Welcome
from skyward_iac.observability.bus import EventBus
from skyward_iac.orchestration.dispatch import Call, Dispatcher, call_for
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.orchestration.membership import Membership
from skyward_iac.orchestration.plan import Bounds
from skyward_iac.orchestration.teardown import Phase, Teardown
from skyward_iac.remote.agent_client import AgentClient, Submission
from skyward_iac.remote.calls import pack_call
from skyward_iac.remote.pacing import Pace


@dataclass(eq=False)
class FakeAgent:
    """What the dispatcher uses of an ``AgentClient``; records every task it is sent."""

    index: int
    received: list[Call] = field(default_factory=list)
    pending: dict[int, Submission] = field(default_factory=dict)
    closed: bool = False
    on_results: Any = None
    on_started: Any = None
    on_lost: Any = None
    pace: Pace = field(default_factory=Pace)

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def submit_many(self, submissions: list[Call]) -> None:
        if self.closed:
            raise NodeConnectionError(f"node {self.index}: connection is closed")
        for submission in submissions:
            self.received.append(submission)
            self.pending[submission.task_id] = submission
            self.pace.sent(submission.name)

    def finish(self, task_id: int, value: Any) -> None:
        call = self.pending.pop(task_id)
        self.pace.finished(call.name)
        call.future.set_result(value)
        if self.on_results:
            self.on_results()

    def break_connection(self, reason: str = "gone") -> None:
        """As the reader does when the connection ends: every pending task, once, to on_lost."""
        self.closed = True
        lost, self.pending = list(self.pending.values()), {}
        self.on_lost(self.index, lost, reason)

    def close(self) -> list[Submission]:
        self.closed = True
        lost, self.pending = list(self.pending.values()), {}
        return lost


@dataclass(eq=False)
class FakeNode:
    index: int
    agent: FakeAgent


class Harness:
    """A dispatcher and a membership wired as ``PoolParts`` wires them."""

    def __init__(self, nodes: int, retries: int = 3, timeout: float = 300.0,
                 worker: sky.Worker | None = None) -> None:
        options = sky.Options(retry_on_interruption=retries, default_compute_timeout=timeout,
                              console=False, worker=worker or sky.Worker(concurrency=2))
        self.dispatcher = Dispatcher(PoolIdentity("test"), options, EventBus())
        self.membership = Membership(Bounds(nodes, nodes, nodes), self.dispatcher.serve,
                                     lambda: None)
        self.membership.declared_now(nodes, tuple(range(nodes)))
        self.nodes = [FakeNode(i, FakeAgent(i)) for i in range(nodes)]
        for node in self.nodes:  # as ``NodeLaunch`` wires every agent client
            node.agent.on_lost = self.lost
            node.agent.on_results = self.dispatcher.slots_freed
            node.agent.on_started = self.dispatcher.events.started
            assert self.membership.joined(node.index, node)  # type: ignore[arg-type]

    def lost(self, index: int, submissions: list[Submission], reason: str) -> None:
        # NodeEvents.out_of_service: out of service first, then the calls.
        self.membership.lose(index, reason)
        self.dispatcher.out_of_service(index, reason)
        self.dispatcher.lost(index, submissions, reason)

    def calls(self, count: int, node: int | None = None,
              timeout: float | None = None) -> list[Call]:
        pending = sky.function(timeout=timeout)(abs)(-1) if timeout else sky.function(abs)(-1)
        packed = pack_call(pending)
        return [call_for(pending, packed, next(self.dispatcher.task_ids), node, 300.0)[0]
                for _ in range(count)]


def wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.01)


def test_close_skips_cancelled_and_finished_futures_and_fails_the_rest() -> None:
    pool = Harness(nodes=1)
    pool.membership.lose(0, "away")  # nothing in service: every call stays queued
    calls = pool.calls(4)
    pool.dispatcher.enqueue(calls)
    calls[0].future.cancel()
    calls[1].future.set_result("done already")
    pool.dispatcher.enqueue([calls[2]])  # the same call queued twice
    pool.dispatcher.close("closing")  # must not raise InvalidStateError
    assert calls[0].future.cancelled()
    assert calls[1].future.result() == "done already"
    for call in calls[2:]:
        with pytest.raises(NodeConnectionError, match="closed"):
            call.future.result(timeout=1)


def test_teardown_runs_every_step_and_raises_the_first_error() -> None:
    ran: list[str] = []
    teardown = Teardown(PoolIdentity("s"))
    teardown.add(Phase.STACK, "destroy", lambda: ran.append("destroy"))
    teardown.add(Phase.COLLECTIONS, "collections",
                 lambda: (_ for _ in ()).throw(RuntimeError("etcd is dead")))
    teardown.add(Phase.PLUGINS, "ctrl-c", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        teardown.run()
    assert ran == ["destroy"]  # its phase is last, and it runs whatever the others raised
    assert [name for name, _ in teardown.errors] == ["ctrl-c", "collections"]


def test_retries_of_a_lost_node_are_held_until_it_is_fenced_and_never_placed_on_it() -> None:
    pool = Harness(nodes=2)
    a, b = pool.nodes
    calls = pool.calls(4)
    pool.dispatcher.enqueue(calls)
    wait_for(lambda: len(a.agent.received) + len(b.agent.received) == 4)
    on_a = [c for c in a.agent.received]
    a.agent.break_connection("killed")
    time.sleep(0.3)  # the dispatcher had every chance to place them
    assert len(a.agent.received) == len(on_a)  # nothing more went to the lost node
    assert all(c.fence == 0 and not c.future.done() for c in on_a)  # held: may still run on a
    received_by_b = len(b.agent.received)
    for call in list(b.agent.pending.values()):
        b.agent.finish(call.task_id, 1)
    time.sleep(0.3)
    assert len(b.agent.received) == received_by_b  # b has room, but they are not fenced yet
    pool.dispatcher.fenced(0)
    wait_for(lambda: all(c in b.agent.received for c in on_a))
    assert all(c.attempts == 1 and c.sent_to == 1 for c in on_a)


def test_each_loss_uses_one_retry_and_the_last_one_fails_the_call() -> None:
    pool = Harness(nodes=3, retries=1)
    (call,) = pool.calls(1, node=None)
    pool.dispatcher.enqueue([call])
    first = pool.nodes[call.sent_to]  # type: ignore[index]
    first.agent.break_connection("spot reclaimed")
    pool.dispatcher.fenced(first.index)
    wait_for(lambda: call.sent_to != first.index)
    assert call.attempts == 1
    second = pool.nodes[call.sent_to]  # type: ignore[index]
    second.agent.break_connection("killed again")
    with pytest.raises(NodeConnectionError, match="no retries left"):
        call.future.result(timeout=2)
    assert call.attempts == 1


def test_a_call_nobody_can_take_fails_after_its_timeout_naming_why() -> None:
    pool = Harness(nodes=1, retries=3)
    (call,) = pool.calls(1, timeout=0.5)
    pool.membership.lose(0, "sshd died")
    pool.dispatcher.out_of_service(0, "sshd died")
    started = time.monotonic()
    pool.dispatcher.enqueue([call])
    with pytest.raises(NodeConnectionError, match="no node is in service .*sshd died"):
        call.future.result(timeout=10)
    assert time.monotonic() - started < 5


class _Agent(threading.Thread):
    """A minimal peer for a real ``AgentClient``: accepts the token, welcomes, then reads."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(daemon=True)
        self.sock = sock

    def run(self) -> None:
        protocol.read_token(self.sock)
        protocol.send(self.sock, protocol.encode(Welcome(node=0, pid=1, python="3",
                                                         protocol=protocol.PROTOCOL_VERSION)))
        try:
            while protocol.read_message(self.sock):
                pass
        except Exception:  # noqa: BLE001 - the client broke the connection
            pass


class _FailingStream:
    """A socket whose sends fail once told to, while its peer closes at the same moment."""

    def __init__(self, sock: socket.socket, peer: socket.socket) -> None:
        self.sock, self.peer, self.failing = sock, peer, False

    def sendall(self, data: Any) -> None:
        if self.failing:
            self.peer.close()  # the reader sees EOF while this send fails
            raise OSError("broken pipe")
        self.sock.sendall(data)

    def recv(self, size: int) -> bytes:
        return self.sock.recv(size)

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("round_", range(20))
def test_a_send_failure_racing_the_reader_reports_each_task_lost_exactly_once(round_: int) -> None:
    ours, theirs = socket.socketpair()
    _Agent(theirs).start()
    stream = _FailingStream(ours, theirs)
    reports: list[list[Submission]] = []
    client = AgentClient(stream, "token", 0, on_lost=lambda node, lost, why: reports.append(lost))
    early = [Submission(i, "f", b"x", None, future=Future()) for i in range(1, 6)]
    client.submit_many(early)
    stream.failing = True
    late = [Submission(i, "f", b"x", None, future=Future()) for i in range(6, 9)]
    client.submit_many(late)
    wait_for(lambda: client.closed)
    time.sleep(0.05)
    reported = [s.task_id for lost in reports for s in lost]
    assert sorted(reported) == list(range(1, 9))  # every task once, none twice
    with pytest.raises(NodeConnectionError):
        client.submit_many([Submission(9, "f", b"x", None, future=Future())])
