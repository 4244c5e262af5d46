"""Locks and queues reuse their keys: etcd keeps every deleted key in its index until the
history is compacted (10 minutes on the head), and each acquire lists the lock's prefix (each
queue claim compares over the queue's), so a fresh key per operation made them slower with every
use (measured: a range over the prefix took 5.5 ms after 2,000 lock pairs, 0.74 ms with reused
keys)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from skyward_iac.collections import Backend, BackendConfig, connect
from skyward_iac.collections.store import Store
from tests.integration.test_collections_linearizable import config  # noqa: F401 - fixture

pytestmark = pytest.mark.integration


@pytest.fixture()
def backend(config: BackendConfig) -> Iterator[Backend]:  # noqa: F811
    with connect(config) as one:
        yield one


def claimed_keys(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every claim key a lock writes from now on."""
    keys: list[str] = []
    write = Store.write_and_list

    def recorded(self: Store, key: str, *args: object, **kwargs: object) -> object:
        keys.append(key)
        return write(self, key, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "write_and_list", recorded)
    return keys


def test_sequential_acquires_reuse_one_claim_key(backend: Backend,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    keys = claimed_keys(monkeypatch)
    for _ in range(20):
        with backend.lock("reuse"):
            pass
    assert len(keys) == 20 and len(set(keys)) == 1


def test_contending_threads_use_one_key_each_at_most(backend: Backend,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    keys = claimed_keys(monkeypatch)
    inside = 0
    overlap = threading.Lock()

    def worker() -> None:
        nonlocal inside
        for _ in range(10):
            with backend.lock("reuse-3"):
                with overlap:
                    inside += 1
                    assert inside == 1
                with overlap:
                    inside -= 1

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(keys) == 30 and len(set(keys)) <= 3
    # Every claim was deleted: nothing of the lock is left in etcd.
    prefix = backend.namespace.collection("lock", "reuse-3")
    assert int(backend.client.range(prefix, prefix=True, count_only=True).count) == 0


def test_a_failed_claim_key_is_never_handed_out_again(backend: Backend,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim whose delete failed may still be in etcd: its slot must not come back."""
    keys = claimed_keys(monkeypatch)
    lock = backend.lock("reuse-failed")
    lock.acquire()
    delete = backend.client.delete

    def failing(*args: object, **kwargs: object) -> object:
        raise RuntimeError("etcd went away")

    monkeypatch.setattr(backend.client, "delete", failing)
    with pytest.raises(RuntimeError):
        lock.release()
    monkeypatch.setattr(backend.client, "delete", delete)
    backend.client.delete(keys[0])  # what the lease's end would do
    with lock:
        pass
    assert len(keys) == 2 and keys[0] != keys[1]


def put_keys(backend: Backend, name: str) -> set[str]:
    """The keys a queue's items are under right now."""
    prefix = backend.namespace.collection("queue", name)
    return {kv.key.decode() for kv in backend.client.range(prefix, prefix=True,
                                                           keys_only=True).kvs}


def test_a_queue_reuses_the_key_of_an_item_its_process_took(backend: Backend) -> None:
    queue, seen = backend.queue("reuse-q"), set()
    for item in range(20):
        queue.put(item)
        seen |= put_keys(backend, "reuse-q")
        assert queue.get(timeout=5) == item
    assert len(seen) == 1


def test_a_producer_reuses_keys_its_items_were_taken_from_by_others(
    backend: Backend, config: BackendConfig,  # noqa: F811
) -> None:
    """Another process's consumer takes every item: the producer never sees it, guesses its
    oldest item's key is free again once 16 are out, and is right."""
    seen: set[str] = set()
    with connect(config) as consumer_side:
        producer, consumer = backend.queue("reuse-pc"), consumer_side.queue("reuse-pc")
        for item in range(60):
            producer.put(item)
            seen |= put_keys(backend, "reuse-pc")
            assert consumer.get(timeout=5) == item
    assert len(seen) <= 17


def test_a_backlog_gets_a_key_per_item_and_fifo_holds(backend: Backend,
                                                      config: BackendConfig) -> None:  # noqa: F811
    """Items nobody took yet keep their keys: a guess finds its key occupied, learns which are,
    and the put goes to a free key; order stays the order of the puts."""
    producer = backend.queue("reuse-backlog")
    for item in range(40):
        producer.put(item)
    assert len(put_keys(backend, "reuse-backlog")) == 40
    with connect(config) as consumer_side:
        consumer = consumer_side.queue("reuse-backlog")
        assert [consumer.get(timeout=5) for _ in range(40)] == list(range(40))
