"""What a node's ``Result`` becomes for the caller: the task's value, or the exception; and
the future that waits for it resolved."""

from __future__ import annotations

import time
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any

from skyward_iac.api.errors import RemoteError, SkywardError
from skyward_iac.node import protocol
from skyward_iac.node.messages import Failure, Result

if TYPE_CHECKING:
    from skyward_iac.remote.agent_client import Submission


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


def settle(future: Future[Any], value: Any, error: BaseException | None) -> bool:
    """Resolve ``future`` with ``value`` or ``error`` (an ``outcome_of``); True when it
    succeeded (False too when it was done already: cancelled by its caller)."""
    try:
        if error is None:
            future.set_result(value)
            return True
        future.set_exception(error)
    except InvalidStateError:
        pass  # cancelled meanwhile
    return False


def fail(submissions: list[Submission], error: BaseException) -> None:
    """Resolve every unfinished future of ``submissions`` with ``error`` (cancelled and
    finished ones are left as they are). A task that was sent is given the time since then
    as its duration (on this client's clock), so its failure says how long it was out."""
    now = time.monotonic()
    for submission in submissions:
        if submission.duration is None and submission.sent_at and not submission.future.done():
            submission.duration = now - submission.sent_at
        try:
            submission.future.set_exception(error)
        except InvalidStateError:
            pass  # already done or cancelled
