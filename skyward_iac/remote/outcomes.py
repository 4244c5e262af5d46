"""What a node's ``Result`` becomes for the caller: the task's value, or the exception."""

from __future__ import annotations

from typing import Any

from skyward_iac.api.errors import RemoteError, SkywardError
from skyward_iac.node import protocol
from skyward_iac.node.messages import Failure, Result


def outcome_of(result: Result, name: str, node: int) -> tuple[Any, BaseException | None]:
    """``(value, None)``, or ``(None, exception)`` when the task failed or its value cannot be
    rebuilt here (reported per task: the connection goes on)."""
    if result.failure is not None:
        return None, rebuild_exception(result.failure, node)
    try:
        return protocol.loads(result.value or b"", result.buffers), None
    except ModuleNotFoundError as exc:
        return None, SkywardError(
            f"the result of {name} from node {node} needs module {exc.name!r}, which is not "
            f"installed on this client: install it here to receive this result")
    except Exception as exc:
        return None, SkywardError(
            f"the result of {name} from node {node} cannot be unpickled here: {exc!r}")


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
