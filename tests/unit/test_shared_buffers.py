"""Large arguments shared by many tasks (issue 32), the parts that need no agent: the client's
packing and budget (remote/shared_buffers.py) and a worker's mappings of a kept buffer
(node/buffer_maps.py), both ends of its maps socket in this process."""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from skyward_iac.node.buffer_maps import Kept, Lease, MapsReceiver, MapsSender
from skyward_iac.node.messages import Task
from skyward_iac.node.shared_refs import Keep, Use
from skyward_iac.remote import shared_buffers

MIB = 1 << 20


def _array(megabytes: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).integers(0, 255, megabytes * MIB, dtype=np.uint8)


def _shareable_of(array: np.ndarray[Any, Any]) -> shared_buffers.Shareable:
    """``array`` as a call that is not the first on it packs it (the first is not digested)."""
    shared_buffers.prepare([memoryview(array)], copy=True)
    (prepared,) = shared_buffers.prepare([memoryview(array)], copy=True)
    assert isinstance(prepared, shared_buffers.Shareable)
    return prepared


def _shareable(megabytes: int, seed: int = 0) -> shared_buffers.Shareable:
    return _shareable_of(_array(megabytes, seed))


def _refs(shared: shared_buffers.SharedBuffers, *buffers: Any) -> list[Any]:
    (task,) = shared.for_agent([Task(1, "f", b"", None, tuple(buffers))])
    return list(task.buffers)


def test_the_client_keeps_within_its_budget_least_recently_used_first() -> None:
    a, b, c = (_shareable(2, seed) for seed in (1, 2, 3))
    shared = shared_buffers.SharedBuffers(budget=5 * MIB)
    assert isinstance(_refs(shared, a)[0], Keep)
    assert isinstance(_refs(shared, b)[0], Keep)
    assert isinstance(_refs(shared, a)[0], Use)  # a is now the most recently used
    (keep_c,) = _refs(shared, c)
    assert isinstance(keep_c, Keep) and keep_c.evict == (b.digest,)
    assert list(shared.held()) == [a.digest, c.digest]
    too_big = _shareable(6)
    assert _refs(shared, too_big)[0] is too_big.buffer  # larger than the budget: sent whole
    small = np.arange(10)
    assert _refs(shared, small)[0] is small  # not shareable: as it was


def test_the_first_call_on_an_array_is_not_digested() -> None:
    array = _array(2)
    (first,) = shared_buffers.prepare([memoryview(array)], copy=False)
    (second,) = shared_buffers.prepare([memoryview(array)], copy=False)
    assert not isinstance(first, shared_buffers.Shareable)
    assert isinstance(second, shared_buffers.Shareable)
    (other,) = shared_buffers.prepare([memoryview(array.copy())], copy=False)
    assert not isinstance(other, shared_buffers.Shareable)  # another object: not seen yet


def test_calls_on_equal_bytes_share_one_snapshot_and_a_change_makes_another() -> None:
    array = _array(2)
    first = _shareable_of(array)
    (again,) = shared_buffers.prepare([memoryview(array)], copy=True)
    assert again.buffer is first.buffer and again.digest == first.digest
    array[0] ^= 0xFF  # the caller changes its array after the calls were made
    (changed,) = shared_buffers.prepare([memoryview(array)], copy=True)
    assert changed.digest != first.digest and changed.buffer is not first.buffer
    assert bytes(first.buffer[:1]) != bytes(changed.buffer[:1])


def test_sharing_off_copies_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(shared_buffers.ENABLED_ENV, "0")
    array = _array(2)
    (one,) = shared_buffers.prepare([memoryview(array)], copy=True)
    (two,) = shared_buffers.prepare([memoryview(array)], copy=True)
    assert isinstance(one, bytearray) and one is not two and one == two


@pytest.fixture()
def maps() -> Iterator[tuple[Any, Any]]:
    """Both ends of a worker's maps socket, in this process."""
    sender = MapsSender()
    receiver = MapsReceiver(os.dup(sender.worker_fd()))
    sender.started()
    yield sender, receiver
    sender.close()
    receiver.close()  # and the thread that watched its idle mappings


def _received(maps: tuple[Any, Any], kept: Any, count: int) -> list[Task]:
    sender, receiver = maps
    sent = sender.for_worker([Task(i, "f", b"", None, (kept,)) for i in range(count)])
    return [receiver.resolve(task) for task in sent]


def test_a_worker_maps_a_kept_buffer_privately(maps: tuple[Any, Any]) -> None:
    data = bytes(_array(2))
    kept = Kept(bytearray(data))
    first, second, third = _received(maps, kept, 3)
    # Weak references only: a task's mapping is reused only if nothing else refers to it.
    receiver = maps[1]
    with Lease(first.buffers) as (mapping,):
        mapping[:4] = b"\0\0\0\0"  # the first task writes its argument
        written = weakref.ref(mapping)
        del mapping
    receiver.settle()  # as the worker does once the task's result left
    assert written() is None  # let go, never used again
    with Lease(second.buffers) as (mapping,):
        assert bytes(mapping) == data  # the second sees the kept bytes
        clean = weakref.ref(mapping)
        del mapping
    with Lease(third.buffers) as (mapping,):
        assert mapping is clean()  # one no task wrote or holds serves the next task on it
        del mapping
    assert os.fstat(kept.memfd()).st_size == len(data)
    with pytest.raises(PermissionError):
        os.write(kept.memfd(), b"x")  # sealed: nobody changes it


def test_a_mapping_a_result_still_refers_to_is_not_reused(maps: tuple[Any, Any]) -> None:
    kept = Kept(bytearray(_array(2)))
    first, second = _received(maps, kept, 2)
    with Lease(first.buffers) as (mapping,):
        view = memoryview(mapping)[:16]  # what a task's result could hold
        held = weakref.ref(mapping)
        del mapping
    with Lease(second.buffers) as (mapping,):
        assert held() is not None and mapping is not held()
    view.release()


def test_a_waiting_batch_digests_each_whole_object_once(monkeypatch: pytest.MonkeyPatch) -> None:
    counted: list[int] = []
    real = shared_buffers.digest
    monkeypatch.setattr(shared_buffers, "digest", lambda view: counted.append(1) or real(view))
    array = _array(4)
    batch = shared_buffers.BatchDigests()
    prepared = [shared_buffers.prepare([memoryview(array)], copy=False, digests=batch)[0]
                for _ in range(5)]  # the first call on it too: its batch's calls come together
    assert all(isinstance(p, shared_buffers.Shareable) for p in prepared)
    assert len(counted) == 1 and len({p.digest for p in prepared}) == 1
    # Parts of one object are digested each on its own: they could start anywhere in it.
    halves = [memoryview(array)[:2 * MIB], memoryview(array)[2 * MIB:]]
    array[2 * MIB:] = array[:2 * MIB]
    shared_buffers.prepare(halves, copy=False, digests=batch)
    before = len(counted)
    first, second = shared_buffers.prepare(halves, copy=False, digests=batch)
    assert len(counted) == before + 2 and first.digest == second.digest  # both digested
