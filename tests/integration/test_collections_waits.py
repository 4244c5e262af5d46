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


def _wait_behind(other: Backend, backend: Backend, name: str) -> None:
    """``backend`` acquires ``name`` once behind ``other``'s claim, then releases it: the
    lock's deletes watch is open in ``backend`` afterwards."""
    prefix = backend.namespace.collection("lock", name)
    holder = other.lock(name, timeout=30)
    holder.acquire()
    mine = backend.lock(name, timeout=30)
    waiter = threading.Thread(target=mine.acquire)
    waiter.start()
    wait_until(lambda: int(other.client.range(prefix, prefix=True, count_only=True).count) == 2,
               "the waiter's claim is in")
    holder.release()
    waiter.join(30)
    mine.release()


def _contend(other: Backend, backend: Backend, name: str, before_release: Any = None) -> None:
    """``other`` holds ``name``; ``backend`` claims it in a thread, waits, and gets it once
    ``other`` releases (after ``before_release()``, called while the waiter waits)."""
    prefix = backend.namespace.collection("lock", name)
    holder = other.lock(name, timeout=30)
    holder.acquire()
    acquired, mine = threading.Event(), backend.lock(name, timeout=60)
    waiter = threading.Thread(target=lambda: (mine.acquire(), acquired.set()))
    waiter.start()
    wait_until(lambda: int(other.client.range(prefix, prefix=True, count_only=True).count) == 2,
               "the waiter's claim is in")
    if before_release is not None:
        before_release()
    time.sleep(0.2)
    assert not acquired.is_set(), "the waiter acquired while the holder held the lock"
    holder.release()
    assert acquired.wait(30), "the waiter never acquired after the holder released"
    waiter.join(30)
    mine.release()


def test_while_a_lock_is_contended_a_wait_costs_no_round_trip_beyond_the_claim(
    config: BackendConfig, backend: Backend, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    with connect(config) as other:
        _wait_behind(other, backend, "busy")
        calls = count_calls(backend, monkeypatch)
        _contend(other, backend, "busy")
    # The claim (which lists the contenders) and the release: the deletes watch the last wait
    # opened is still open. Was: the claim, a watch, a listing once it opened, the release.
    assert calls == ["Txn", "DeleteRange"], calls


def test_a_claim_deleted_and_made_again_before_ours_is_still_ahead(
    config: BackendConfig, backend: Backend,  # noqa: F811
) -> None:
    from skyward_iac.collections.deletions import deletions_of

    with connect(config) as other:
        _wait_behind(other, backend, "again")
        holder = other.lock("again", timeout=30)
        # The holder releases and claims again under the same key (slots are reused) before
        # our claim: the open watch has seen that key deleted, but before our claim's revision.
        holder.acquire()
        key = other.client.range(backend.namespace.collection("lock", "again"),
                                 prefix=True).kvs[0].key.decode()
        holder.release()
        deletions = deletions_of(backend.lock("again")._store)
        wait_until(lambda: key in deletions._deleted, "the watch saw the release")
        _contend(other, backend, "again")  # the waiter does not take the held lock


def test_a_waiter_whose_deletes_watch_breaks_opens_it_again_and_lists(
    config: BackendConfig, backend: Backend, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    from skyward_iac.collections.deletions import deletions_of

    with connect(config) as other:
        _wait_behind(other, backend, "broken")
        deletions = deletions_of(backend.lock("broken")._store)
        calls = count_calls(backend, monkeypatch)

        def break_the_stream() -> None:
            deletions._on_change(deletions._generation, RuntimeError("stream reset"))
            wait_until(lambda: calls.count("Range") == 1, "the waiter listed again")

        _contend(other, backend, "broken", break_the_stream)
    assert calls == ["Txn", "watch", "Range", "DeleteRange"], calls


def test_a_waiter_whose_claim_expires_while_the_watch_is_open_is_told(
    config: BackendConfig, backend: Backend,  # noqa: F811
) -> None:
    from skyward_iac.api.errors import CollectionError

    with connect(config) as other:
        _wait_behind(other, backend, "expiring")
        holder = other.lock("expiring", timeout=30)
        holder.acquire()
        prefix = backend.namespace.collection("lock", "expiring")
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                backend.lock("expiring", timeout=60).acquire()
            except CollectionError as exc:
                errors.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        wait_until(lambda: int(other.client.range(prefix, prefix=True, count_only=True).count)
                   == 2, "the waiter's claim is in")
        # What a lease that ran out does: etcd deletes every key attached to it.
        backend.client.revoke_lease(backend._lease().lease_id())
        waiter.join(30)
        assert not waiter.is_alive(), "the waiter never noticed its claim was gone"
        assert errors and "vanished" in str(errors[0]), errors
        holder.release()


def test_a_lock_no_longer_used_lets_its_deletes_watch_go(
    config: BackendConfig, backend: Backend, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    from skyward_iac.collections import deletions as module

    monkeypatch.setattr(module, "IDLE", 0.2)
    with connect(config) as other:
        _wait_behind(other, backend, "left")
        deletions = module.deletions_of(backend.lock("left")._store)
        assert deletions._watch_id is not None  # open after the wait
        # Nobody uses the lock any more: no claim comes to close it, its own thread does.
        wait_until(lambda: deletions._watch_id is None, "the idle watch is closed", timeout=10)
        _contend(other, backend, "left")  # and a later wait opens it again
