"""Turning a ``PendingFunction`` into bytes for the wire, with errors that name the culprit."""

from __future__ import annotations

import pickle
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.function import PendingFunction
from skyward_iac.node import messages, protocol
from skyward_iac.remote import function_pickles, shared_buffers

_INSTALLED_ROOTS = tuple(
    Path(p).resolve()
    for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (p := sysconfig.get_paths().get(key))
)
_by_value: set[str] = set()


def ship_module_by_value(fn: Any) -> None:
    """Pickle the module defining ``fn`` by value when nodes cannot import it.

    A function's helpers and classes living in the user's own project (not installed in
    site-packages) would otherwise be pickled by reference and fail to import on the node.
    """
    name = getattr(fn, "__module__", None)
    module = sys.modules.get(name or "")
    if (module is None or name is None or name in _by_value or name == "__main__"
            or name.startswith("skyward_iac")):
        return
    file = getattr(module, "__file__", None)
    if not file or any(Path(file).resolve().is_relative_to(root) for root in _INSTALLED_ROOTS):
        return
    cloudpickle.register_pickle_by_value(module)
    _by_value.add(name)


@dataclass(frozen=True, slots=True)
class PackedCall:
    """A call ready for the wire: its pickle and the large buffers kept out of it."""

    payload: bytes
    buffers: tuple[Any, ...] = ()


def pack_function(fn: Any) -> messages.PickledFunction:
    """Pickle a function once, for any number of calls (``pack_call(..., function=...)``);
    the bytes of its last pickle when nothing it is made of changed since
    (``function_pickles``)."""
    ship_module_by_value(fn)
    return messages.PickledFunction(function_pickles.pickled(fn, protocol.dumps))


def pack_call(pending: PendingFunction[Any], copy: bool = True,
              function: messages.PickledFunction | None = None,
              digests: shared_buffers.BatchDigests | None = None) -> PackedCall:
    """Pickle ``(fn, args, kwargs)``; an unpicklable part raises ``ConfigError`` naming it.

    The function travels as a ``PickledFunction`` (``function``: pickled already, shared by
    many calls), so nodes unpickle each distinct function once. Large contiguous buffers
    (numpy arrays, ...) stay out of the pickle (protocol 5). With ``copy`` they are copied once,
    now, because the caller may change its arrays as soon as the call is made; ``copy=False``
    (views, no copy) is for callers that wait for the result. Buffers of at least
    ``shared_buffers.SHARE_MIN`` bytes are digested, so a node is sent each only once, and
    calls whose buffers hold equal bytes share one snapshot (remote/shared_buffers.py);
    ``digests``, for calls without snapshot whose caller waits for them all, digests each
    object once for all of them.
    """
    try:
        packed_fn = function or pack_function(pending.fn)
        if _plain(pending.args) and (not pending.kwargs or _plain(pending.kwargs)):
            # Nothing but plain values: the C pickler alone makes the same pickle without
            # cloudpickle's per-object hook, and there is no buffer to keep out of band.
            return PackedCall(pickle.dumps((packed_fn, pending.args, pending.kwargs),
                                           protocol=5))
        payload, views = protocol.dumps_with_buffers(
            (packed_fn, pending.args, pending.kwargs), copy=False)
    except Exception as exc:
        raise ConfigError(_culprit(pending, exc)) from exc
    return PackedCall(payload, shared_buffers.prepare(views, copy, digests))


#: Values pickled the same by pickle and cloudpickle, always in band.
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes})
#: Items looked at, at most, before arguments count as not plain (cloudpickle takes them).
_PLAIN_ITEMS = 64


def _plain(value: Any) -> bool:
    """Whether ``value`` holds only ``_PLAIN`` values in tuples, lists and dicts (a few)."""
    budget = _PLAIN_ITEMS
    stack = [value]
    while stack:
        item = stack.pop()
        budget -= 1
        if budget < 0:
            return False
        kind = type(item)
        if kind in _PLAIN:
            continue
        if kind is tuple or kind is list:
            stack.extend(item)
        elif kind is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            return False
    return True


def _culprit(pending: PendingFunction[Any], error: Exception) -> str:
    parts: list[tuple[str, Any]] = [("the function itself", pending.fn)]
    parts += [(f"argument {i}", arg) for i, arg in enumerate(pending.args)]
    parts += [(f"keyword argument {key!r}", value) for key, value in pending.kwargs.items()]
    for label, value in parts:
        try:
            protocol.dumps(value)
        except Exception as exc:
            return (f"cannot send {pending.name} to the pool: {label} ({type(value).__name__}) "
                    f"cannot be pickled: {exc}")
    return f"cannot send {pending.name} to the pool: {error}"
