"""The distributed FIFO queue, with exactly-once delivery to concurrent consumers."""

from __future__ import annotations

import time
import uuid
from typing import Any

from skyward_iac.collections.base import Collection, async_twin, check_timeout
from skyward_iac.collections.client import create_revision_is, delete_op
from skyward_iac.collections.namespace import decode_value, encode_value


class Queue(Collection):
    """A shared FIFO: ``put(v)``, ``get(timeout=None)`` (None on timeout), ``empty()``,
    ``len(q)``. Always strongly consistent.

    Each item is its own key; FIFO order is etcd's commit order (create revision). ``get``
    claims the oldest item with a transaction that deletes it only if it is still the same key
    at the same create revision, so of many consumers racing for one item exactly one wins and
    the others move on to the next. Finding the oldest item sorts the whole queue on the server
    (etcd cannot push a limit under a create-revision sort): fine for thousands of items.
    """

    kind = "queue"

    def put(self, value: Any) -> None:
        """Appends ``value`` to the queue."""
        # The key only has to be unique; ordering comes from the create revision.
        self._store.write(self._store.key(f"{time.time_ns():020d}-{uuid.uuid4().hex}"),
                          encode_value(value))

    def get(self, timeout: float | None = None) -> Any:
        """Removes and returns the oldest item, waiting up to ``timeout`` seconds for one
        (forever when None); returns None if none arrived in time."""
        if timeout is not None:
            timeout = check_timeout(timeout, f"queue {self.name!r} get(timeout)", zero=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        client, prefix = self._store.client, self._store.prefix
        while True:
            head = client.range(prefix, prefix=True, keys_only=True, oldest_first=True, limit=1)
            if head.kvs:
                key, created = head.kvs[0].key.decode(), int(head.kvs[0].create_revision)
                claim = client.txn([create_revision_is(key, created)],
                                   [delete_op(key, prev_kv=True)])
                prev = claim.responses[0].response_delete_range.prev_kvs if claim.succeeded else ()
                if prev:
                    return decode_value(bytes(prev[0].value))
                continue  # another consumer took it first: look again at once
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            # Wait for any change after the read that found the queue empty (none is missed).
            client.wait_for_change(prefix, prefix=True,
                                   start_revision=int(head.header.revision) + 1, timeout=remaining)

    def empty(self) -> bool:
        """Whether the queue holds no item right now."""
        return self._store.count() == 0

    def __len__(self) -> int:
        return self._store.count()

    put_async = async_twin(put)
    get_async = async_twin(get)
    empty_async = async_twin(empty)
    len_async = async_twin(__len__)
