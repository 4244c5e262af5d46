"""A task's failure on a node, rebuilt as the exception the caller gets."""

from __future__ import annotations

from skyward_iac.api.errors import RemoteError
from skyward_iac.node import protocol
from skyward_iac.node.messages import Failure


def rebuild_exception(failure: Failure, node: int) -> Exception:
    """The remote exception with its type when it can be rebuilt, else a ``RemoteError``;
    either way the remote traceback is attached (as a note and ``remote_traceback``).

    Always an ``Exception``: a task's ``SystemExit``, ``KeyboardInterrupt`` or
    ``GeneratorExit`` comes back as a ``RemoteError`` naming it, never as an exit or an
    interrupt of the client."""
    exc: object = None
    if failure.exception is not None:
        try:
            exc = protocol.loads(failure.exception)
        except Exception:
            exc = None
    if not isinstance(exc, Exception):
        exc = RemoteError(failure.type_name, failure.message, failure.traceback)
    exc.add_note(f"\nRemote traceback (node {node}):\n{failure.traceback.rstrip()}")
    try:
        exc.remote_traceback = failure.traceback  # type: ignore[attr-defined]
    except AttributeError:
        pass
    return exc
