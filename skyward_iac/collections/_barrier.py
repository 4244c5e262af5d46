"""The distributed barrier: nobody leaves before the n-th participant arrives."""

from __future__ import annotations

import time

from pyetcd.events import PutEvent

from skyward_iac.api.errors import ConfigError
from skyward_iac.collections.base import Collection, async_twin, check_timeout
from skyward_iac.collections.client import mod_revision_is, put_op
from skyward_iac.collections.store import Store

_ARRIVALS = "arrivals"


class Barrier(Collection):
    """A cyclic barrier for ``n`` participants: ``wait()`` blocks until ``n`` have called it.

    Arrivals are counted by one atomic counter. The k-th arrival (from 1) belongs to round
    ``ceil(k / n)`` and is released once the count reaches ``ceil(k / n) * n``, so the same
    barrier can be reused round after round (one per epoch) without a reset.
    """

    kind = "barrier"

    def __init__(self, name: str, store: Store, n: int, default_timeout: float) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"barrier {name!r} needs n >= 1 participants, got n={n!r}")
        super().__init__(name, store)
        self.n = n
        self.default_timeout = default_timeout
        self._key = store.key(_ARRIVALS)

    def wait(self, timeout: float | None = None) -> int:
        """Blocks until all ``n`` participants of this round arrived; returns this caller's
        arrival index in the round (0 .. n-1).

        Raises TimeoutError after ``timeout`` seconds (default: the backend's barrier timeout)
        and withdraws this arrival, so the barrier stays usable for the others.
        """
        limit = self.default_timeout if timeout is None else check_timeout(
            timeout, f"barrier {self.name!r} wait(timeout)")
        deadline = time.monotonic() + limit
        ticket = self._store.add(self._key, 1)
        target = -(-ticket // self.n) * self.n
        if ticket >= target:
            return (ticket - 1) % self.n  # the round's last arrival: nobody to wait for
        client = self._store.client
        # A watch from now, then a read (one from a past revision is served up to 100 ms late:
        # see EtcdClient.changes); later counts come with the watch's events.
        with client.changes(self._key, prefix=False) as changes:
            response = client.range(self._key)
            arrived = int(response.kvs[0].value) if response.kvs else 0
            while arrived < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if self._withdraw(target):
                        raise TimeoutError(
                            f"barrier {self.name!r}: only {arrived - (target - self.n)} of "
                            f"{self.n} participants arrived within {limit:g}s; check that every "
                            "node reaches wait() (a failed or preempted task never will) or "
                            "pass a larger timeout")
                    return (ticket - 1) % self.n  # the round completed meanwhile
                for event in changes.next(remaining) or ():
                    arrived = int(event.value) if isinstance(event, PutEvent) else 0
        return (ticket - 1) % self.n

    def _withdraw(self, target: int) -> bool:
        """Takes this arrival back unless the round completed meanwhile (then: False)."""
        client = self._store.client
        while True:
            kvs = client.range(self._key).kvs
            arrived, revision = (int(kvs[0].value), int(kvs[0].mod_revision)) if kvs else (0, 0)
            if arrived >= target:
                return False
            swapped = client.txn([mod_revision_is(self._key, revision)],
                                 [put_op(self._key, str(arrived - 1).encode())])
            if swapped.succeeded:
                return True

    def __repr__(self) -> str:
        return f"Barrier({self.name!r}, n={self.n})"

    wait_async = async_twin(wait)
