"""The distributed dict: get/put/delete/contains by key, no enumeration (as in the seeds)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from skyward_iac.collections.base import Collection, async_twin
from skyward_iac.collections.namespace import decode_value, encode_value, item_key


class Dict(Collection):
    """A shared key-value map: ``d[k]``, ``d[k] = v``, ``del d[k]``, ``k in d``, ``get``,
    ``update``, ``pop``.

    Keys compare by type and value (see ``namespace.item_key``); values are cloudpickled and
    come back as copies, so mutate-then-write (``d[k] = v``) to change one.
    """

    kind = "dict"

    def __getitem__(self, key: Any) -> Any:
        data = self._store.read(self._key(key))
        if data is None:
            raise KeyError(key)
        return decode_value(data)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._store.write(self._key(key), encode_value(value))

    def __delitem__(self, key: Any) -> None:
        if self._store.remove(self._key(key)) is None:
            raise KeyError(key)

    def __contains__(self, key: Any) -> bool:
        return self._store.exists(self._key(key))

    def get(self, key: Any, default: Any = None) -> Any:
        """The value at ``key``, or ``default`` when absent."""
        data = self._store.read(self._key(key))
        return default if data is None else decode_value(data)

    def update(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        """Writes many pairs (a mapping or an iterable of pairs), batched into transactions."""
        pairs = items.items() if isinstance(items, Mapping) else items
        self._store.write_many([(self._key(k), encode_value(v)) for k, v in pairs])

    def pop(self, key: Any, default: Any = None) -> Any:
        """Removes ``key`` and returns its value (atomically), or ``default`` when absent."""
        data = self._store.remove(self._key(key))
        return default if data is None else decode_value(data)

    get_async = async_twin(get)
    set_async = async_twin(__setitem__)
    delete_async = async_twin(__delitem__)
    contains_async = async_twin(__contains__)
    update_async = async_twin(update)
    pop_async = async_twin(pop)

    def _key(self, key: Any) -> str:
        return self._store.key(item_key(key))
