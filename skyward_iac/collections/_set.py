"""The distributed set: add, discard, membership and size."""

from __future__ import annotations

from typing import Any

from skyward_iac.collections.base import Collection, async_twin
from skyward_iac.collections.namespace import encode_value, item_key


class Set(Collection):
    """A shared set: ``v in s``, ``len(s)``, ``add(v)``, ``discard(v)``.

    Members compare by type and value (see ``namespace.item_key``). Each member is its own etcd
    key, so adds from many nodes never contend.
    """

    kind = "set"

    def add(self, value: Any) -> None:
        """Adds ``value`` (no error if it is already a member)."""
        # The member itself is stored so etcdctl users (and a future iteration) can read it.
        self._store.write(self._key(value), encode_value(value))

    def discard(self, value: Any) -> None:
        """Removes ``value`` if it is a member."""
        self._store.remove(self._key(value))

    def __contains__(self, value: Any) -> bool:
        return self._store.exists(self._key(value))

    def __len__(self) -> int:
        return self._store.count()

    add_async = async_twin(add)
    discard_async = async_twin(discard)
    contains_async = async_twin(__contains__)
    len_async = async_twin(__len__)

    def _key(self, value: Any) -> str:
        return self._store.key(item_key(value))
