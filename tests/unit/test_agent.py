"""The worker agent as a real process on loopback: token check first, then tasks."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from skyward_iac.api.errors import NodeConnectionError
from skyward_iac.node import protocol
from skyward_iac.node.messages import Welcome
from skyward_iac.remote.agent_client import AgentClient, Submission, fail
from skyward_iac.remote.pacing import ahead
from tests.agent_process import TOKEN, closed_without_greeting, running_agent


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with running_agent(tmp_path_factory.mktemp("agent"), "--concurrency", "2",
                       "--node", "3") as started:
        yield started.port


def test_wrong_token_is_disconnected_without_a_greeting(agent: int) -> None:
    with socket.create_connection(("127.0.0.1", agent)) as sock:
        protocol.Channel(sock).send_raw(b"not-the-token")
        assert closed_without_greeting(sock)


def test_pickle_before_token_is_never_read(agent: int) -> None:
    with socket.create_connection(("127.0.0.1", agent)) as sock:
        protocol.Channel(sock).send(Welcome(0, 0, "x", protocol.PROTOCOL_VERSION))
        assert closed_without_greeting(sock)


def test_the_welcome_names_the_protocol_version(agent: int) -> None:
    client = AgentClient(socket.create_connection(("127.0.0.1", agent)), TOKEN, node=3)
    try:
        assert client.welcome.protocol == protocol.PROTOCOL_VERSION
    finally:
        client.close()


def test_a_client_refuses_an_agent_of_another_protocol() -> None:
    ours, theirs = socket.socketpair()
    with theirs:
        channel = protocol.Channel(theirs)
        channel.send(Welcome(0, 1, "3.11", protocol.PROTOCOL_VERSION - 1))
        version = protocol.PROTOCOL_VERSION
        with pytest.raises(NodeConnectionError,
                           match=f"protocol {version - 1}, this client {version}"):
            AgentClient(ours, TOKEN, node=0)
        assert channel.receive_raw() == TOKEN.encode()  # it sent the token, then gave up


def test_valid_token_gets_welcome_and_runs_tasks(agent: int) -> None:
    sock = socket.create_connection(("127.0.0.1", agent))
    client = AgentClient(sock, TOKEN, node=3)
    try:
        assert client.welcome.node == 3
        payload = protocol.dumps((pow, (2, 10), {}))
        assert client.submit("pow", payload, timeout=10).result(10) == 1024
        failing = protocol.dumps((int, ("nope",), {}))
        with pytest.raises(ValueError, match="invalid literal"):
            client.submit("int", failing, timeout=10).result(10)
    finally:
        client.close()


def test_timeout_fails_the_future_and_later_tasks_still_run(agent: int) -> None:
    sock = socket.create_connection(("127.0.0.1", agent))
    client = AgentClient(sock, TOKEN, node=3)
    try:
        slow = protocol.dumps((time.sleep, (2,), {}))
        with pytest.raises(TimeoutError, match="sleep did not finish within its timeout of 0.2s"):
            client.submit("sleep", slow, timeout=0.2).result(10)
        quick = protocol.dumps((abs, (-4,), {}))
        assert client.submit("abs", quick, timeout=10).result(10) == 4
    finally:
        client.close()


def test_a_timed_out_task_says_how_long_it_was_out(agent: int) -> None:
    """Issue 29 item 9: a task that timed out was reported "FAILED ... after 0.0s"; its
    duration is now the time it was out, as measured on this client's clock."""
    client = AgentClient(socket.create_connection(("127.0.0.1", agent)), TOKEN, node=3)
    try:
        submission = Submission(90_001, "sleep", protocol.dumps((time.sleep, (3,), {})), 0.5)
        client.submit_many([submission])
        with pytest.raises(TimeoutError):
            submission.future.result(10)
        assert submission.duration is not None and 0.5 <= submission.duration < 3
    finally:
        client.close()


def test_a_task_failed_by_the_client_gets_its_time_out_as_duration() -> None:
    sent = Submission(1, "f", b"", None, sent_at=time.monotonic() - 2.0)
    never_sent = Submission(2, "g", b"", None)
    done = Submission(3, "h", b"", None, sent_at=time.monotonic() - 9.0, duration=0.25)
    done.future.set_result(1)
    fail([sent, never_sent, done], NodeConnectionError("node 0 was lost"))
    assert sent.duration is not None and 2.0 <= sent.duration < 10
    assert never_sent.duration is None  # it never left: nothing ran anywhere
    assert done.duration == 0.25 and done.future.result() == 1  # left as it was


def test_a_retained_notice_reaches_clients_that_connect_later() -> None:
    """A preemption notice seen before the client connects (or reconnects) is not lost."""
    from skyward_iac.node.agent import Listeners
    from skyward_iac.node.messages import PreemptionNotice

    class Recorder:
        def __init__(self) -> None:
            self.messages: list[object] = []

        def send(self, message: object) -> None:
            self.messages.append(message)

    listeners = Listeners()
    early, late = Recorder(), Recorder()
    listeners.add(early)  # type: ignore[arg-type]
    notice = PreemptionNotice(1, time.time() + 120, "spot interruption")
    listeners.notify(notice, retain=True)
    listeners.notify("a metric sample")  # not retained
    listeners.add(late)  # type: ignore[arg-type]
    assert early.messages == [notice, "a metric sample"]
    assert late.messages == [notice]


def test_the_client_measures_the_nodes_pace_from_real_results(agent: int) -> None:
    """Trivial tasks one at a time: the overhead (round trip) dwarfs the run time, so "auto"
    would send ahead; a 0.2 s task is longer than the round trip, so nothing ahead."""
    client = AgentClient(socket.create_connection(("127.0.0.1", agent)), TOKEN, node=3)
    try:
        for _ in range(20):
            assert client.submit("abs", protocol.dumps((abs, (-1,), {})), timeout=10).result(10)
        pace = client.pace
        assert pace.overhead is not None and pace.overhead > 0
        assert pace.run_time("abs") < pace.overhead
        assert ahead(1, pace.overhead, pace.run_time("abs")) >= 2
        assert pace.longest_held() == 0.0  # nothing held after the results
        client.submit("sleep", protocol.dumps((time.sleep, (0.2,), {})), timeout=10).result(10)
        assert pace.run_time("sleep") >= 0.2
        assert ahead(1, pace.overhead, pace.run_time("sleep")) == 0
    finally:
        client.close()
