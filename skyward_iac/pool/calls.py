"""Turning a ``PendingFunction`` into bytes for the wire, with errors that name the culprit."""

from __future__ import annotations

from typing import Any

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.function import PendingFunction
from skyward_iac.remote import protocol


def pack_call(pending: PendingFunction[Any]) -> bytes:
    """Pickle ``(fn, args, kwargs)``; an unpicklable part raises ``ConfigError`` naming it."""
    try:
        return protocol.dumps((pending.fn, pending.args, pending.kwargs))
    except Exception as exc:
        raise ConfigError(_culprit(pending, exc)) from exc


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
