"""Waiting costs one watch, not a round trip per wake-up: a lock waiter crosses off the claims
ahead of it as their deletes arrive on one watch (no listing after each), and a queue ``get``
that loses an item to another consumer waits on in the same watch. Counted on a real etcd.

Every wait's watch starts from now, not from the revision of the read that decided to wait:
etcd serves a watch that starts in the past from a loop that runs every 100 ms."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from skyward_iac.collections import Backend, BackendConfig, connect
from tests.integration.test_collections_linearizable import config  # noqa: F401 - fixture

pytestmark = pytest.mark.integration


@pytest.fixture()
def backend(config: BackendConfig) -> Iterator[Backend]:  # noqa: F811
    with connect(config) as one:
        yield one


def count_calls(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The KV RPCs and watches ``backend`` makes from now on, in order (watches as "watch")."""
    client = backend.client
    calls: list[str] = []
    stub = client._etcd.kvstub
    for name in ("Range", "Put", "DeleteRange", "Txn"):
        method = getattr(stub, name)
        monkeypatch.setattr(stub, name, lambda *a, _m=method, _n=name, **k: (
            calls.append(_n), _m(*a, **k))[1])
    watch = client.watch
    monkeypatch.setattr(client, "watch", lambda *a, **k: (calls.append("watch"), watch(*a, **k))[1])
    return calls


def wait_until(predicate: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def test_a_waiter_behind_two_claims_opens_one_watch_and_never_lists_again(
    config: BackendConfig, backend: Backend, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    prefix = backend.namespace.collection("lock", "line")
    with connect(config) as other:
        holder = other.lock("line", timeout=30)
        holder.acquire()
        # A second claim queues behind the holder, then gives up (withdrawing its claim).
        outcome: list[str] = []

        def quit_waiting() -> None:
            try:
                other.lock("line").acquire(timeout=5)
                outcome.append("acquired")
            except TimeoutError:
                outcome.append("gave up")

        def claims() -> int:
            return int(other.client.range(prefix, prefix=True, count_only=True).count)

        quitter = threading.Thread(target=quit_waiting)
        quitter.start()
        wait_until(lambda: claims() == 2, "the second claim is in")
        calls = count_calls(backend, monkeypatch)
        acquired, mine = threading.Event(), backend.lock("line")
        waiter = threading.Thread(target=lambda: (mine.acquire(timeout=60),
                                                  acquired.set()))
        waiter.start()
        wait_until(lambda: claims() == 3, "the waiter's claim is in")
        assert quitter.is_alive(), "the quitter gave up before the waiter claimed: retry"
        quitter.join(30)
        assert outcome == ["gave up"]
        # The quitter's claim is gone but the holder's is not: still waiting.
        assert not acquired.is_set()
        holder.release()
        assert acquired.wait(30), "the waiter never acquired after both claims ahead went"
        waiter.join(30)
    mine.release()
    # The claim, one watch and one listing once it is open, the release. Was: a watch and a
    # listing per claim deleted ahead (two of each).
    assert calls == ["Txn", "watch", "Range", "DeleteRange"], calls


def test_a_waiting_get_that_loses_an_item_waits_on_in_the_same_watch(
    config: BackendConfig, backend: Backend, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    queue = backend.queue("steal")
    calls = count_calls(backend, monkeypatch)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(queue.get(timeout=60)))
    waiter.start()
    wait_until(lambda: "watch" in calls, "the get waits")
    with connect(config) as other:
        # Hold the waiter's claims back (its process's listing lock) while another consumer
        # takes the item it was woken for: its claim then finds the queue empty again.
        with queue._listing.lock:
            other.queue("steal").put("stolen")
            assert other.queue("steal").get(timeout=5) == "stolen"
        time.sleep(0.3)  # the waiter tries, finds nothing, and waits on
        other.queue("steal").put("kept")
        waiter.join(30)
    assert got == ["kept"]
    assert calls.count("watch") == 1, calls  # was one more watch per lost race
