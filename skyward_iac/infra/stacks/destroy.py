"""The one destroy path: every destroyer of a pool's stack goes through ``destroy``.

The destroyers: the pool's own exit (``orchestration/lifecycle.py``), a warm pool's keeper
(``orchestration/keeper.py``), a dead Jupyter kernel's reaper
(``orchestration/kernel_reaper.py``), gc (``gc.py``) and ``skyward-iac down``. Each says who
it is and why (a ``Destroyer``); this path applies one policy to all of them:

* **Authority** (``takedown.refusal``, pure): the owner's own processes hold the stack and
  may always destroy it; anyone else is refused while the owner may still use it, unless
  forced. The refusal names the owner, its host, the lease left and how to force it. The
  count is read again once the owner is judged: an owner that ended its pool meanwhile keeps
  its own record (``already down``).
* **The lock** is the engine's lock on the stack. A destroyer that finds it held waits up to
  its ``patience`` (gc and ``down``: none, they leave it to whoever holds it; the owner:
  ``Options(shutdown_timeout)``; the reaper 120 s), clearing a lock whose holder died on this
  machine, and, before it tries again, looks whether anything is left to destroy (the
  stack's holder destroys all the same, to record its end, unless another took it down).
* **The record**: the update's message ``skyward: destroyed by ACTOR: REASON`` (so ``pulumi
  stack history`` alone says who ended each run and why) and the ``ended`` tag (status, actor,
  destroyer, reason; a failed destroy's error class) that ``history`` reads. A destroyer from
  outside the pool first tags ``down_by``: the owner, if it still runs, stops instead of
  replacing the nodes it loses.
* **A failed destroy** is recorded (``destroy failed`` with the error class) and left: the
  stack still holds resources and gc collects it once its owner is gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from skyward_iac.api import retry
from skyward_iac.api.errors import StackBusyError
from skyward_iac.infra.clouds import cloud_of_stack
from skyward_iac.infra.engine.command import completed
from skyward_iac.infra.identity import cloud_identity
from skyward_iac.infra.stacks import owners
from skyward_iac.infra.stacks.owners import Look
from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.infra.stacks.tags import DOWN_BY, ENDED, StackRecord, ended_value
from skyward_iac.infra.stacks.takedown import destroy_message, holder_of, refusal

log = logging.getLogger("skyward")

#: Who destroys (the ``via`` of a ``Destroyer`` and of the ``ended`` tag).
POOL, KEEPER, REAPER, GC, DOWN = "pool", "keeper", "kernel reaper", "gc", "down"
#: What became of a destroy (``Outcome.status``).
DESTROYED, ALREADY_DOWN, REFUSED, BUSY, FAILED = (
    "destroyed", "already down", "refused", "busy", "destroy failed")


@dataclass(frozen=True, slots=True)
class Destroyer:
    """Who asks for a destroy and why; recorded with it."""

    #: ``POOL``, ``KEEPER``, ``REAPER``, ``GC`` or ``DOWN``.
    via: str
    reason: str
    #: Who destroys, and how that is known (``cloud_identity.actor``: on a cloud the
    #: identity its credentials authenticate, else ``user@host``, self-declared); "": this
    #: process's, for the stack's provider.
    actor: str = ""
    source: str = ""
    #: The caller holds the stack (the pool's own exit, its keeper): no authority check.
    holds: bool = False
    force: bool = False
    #: Seconds to wait for another update's lock on the stack (0: leave it to that update).
    patience: float = 0.0

    @property
    def message(self) -> str:
        return destroy_message(self.actor, self.reason)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one destroy."""

    stack: str
    status: str
    #: The refusal, or the error's last line.
    detail: str = ""
    error: Exception | None = None
    #: The destroy's update message (who and why), once one was attempted.
    message: str = ""

    @property
    def gone(self) -> bool:
        """Whether the stack holds nothing any more (destroyed now or before)."""
        return self.status in (DESTROYED, ALREADY_DOWN)


def destroy(stack: ClusterStack | str, who: Destroyer, *,
            seen: tuple[StackRecord, Look] | None = None,
            on_event: Callable[[Any], Any] | None = None) -> Outcome:
    """Destroy ``stack`` for ``who`` (see the module doc). ``seen``: the stack's record and a
    look at it the caller has already taken (gc), else both are read now for a destroyer that
    does not hold the stack. A ``KeyboardInterrupt`` is raised as it came (the engine lets a
    destroy under way finish first: ``finished_despite``); ``StackNotFoundError`` too."""
    handle = stack if isinstance(stack, ClusterStack) else ClusterStack.select(stack)
    name = handle.name
    if not who.actor:
        actor, source = cloud_identity.actor(cloud_of_stack(name).kind)
        who = replace(who, actor=actor, source=source)
    if not who.holds:
        record, look = seen or _look_at(handle)
        if record.resource_count == 0:
            return Outcome(name, ALREADY_DOWN)
        if why := refusal(name, holder_of(record, look), force=who.force):
            return Outcome(name, REFUSED, why)
        # The owner was judged just now; the count read before (gc's listing, or this
        # function's own look a second ago) may predate its own destroy, which its process
        # ended after: the emptied stack's record is the owner's.
        if _emptied(handle):
            return Outcome(name, ALREADY_DOWN)
    lock_wait, started, tries = retry.for_stack_lock(who.patience), time.monotonic(), 0
    deleted = _Deleted(on_event)
    try:
        if not who.holds:
            handle.mark_taken_down(who.message)
        while True:
            try:
                if not who.holds:  # what a crash left (a stale lock, pending operations)
                    handle.clear_crash_leftovers()
                handle.destroy(message=who.message, on_event=deleted if who.holds else on_event)
                break
            except StackBusyError as exc:
                tries += 1
                delay = lock_wait.again(exc, tries, time.monotonic() - started)
                if delay is None:
                    return Outcome(name, BUSY, f"another update holds the stack ({exc})", exc,
                                   who.message)
                if handle.stale_locks():  # its holder died on this machine
                    handle.clear_crash_leftovers()
                time.sleep(delay)
                if _finished_by_another(handle, who):
                    return Outcome(name, ALREADY_DOWN, message=who.message)
    except Exception as exc:  # noqa: BLE001 - recorded; the caller decides what it means
        _record(handle, who, FAILED, type(exc).__name__)
        lines = str(exc).strip().splitlines()
        return Outcome(name, FAILED, lines[-1] if lines else repr(exc), exc, who.message)
    # A destroy that deleted nothing, of a stack someone else took down meanwhile (``down
    # --force``, gc): the record is theirs, not overwritten. Read only then (no engine command
    # before the destroy: a Ctrl+C there would keep it from running).
    if who.holds and deleted.count == 0 and _taken_down(handle):
        return Outcome(name, ALREADY_DOWN, message=who.message)
    _record(handle, who, DESTROYED)
    return Outcome(name, DESTROYED, message=who.message)


def finished_despite(interrupt: KeyboardInterrupt, stack: ClusterStack) -> bool:
    """Whether a destroy a Ctrl+C interrupted ran to its end all the same (the engine lets a
    destroy under way finish): its own exit status says so when it has one; else whether the
    stack holds nothing (False when that cannot be read)."""
    ended = completed(interrupt)
    if ended is not None:
        return ended.code == 0
    try:
        return stack.resource_count() == 0
    except Exception:  # noqa: BLE001 - unknown: the caller reports nothing
        return False


class _Deleted:
    """Passes a destroy's engine events on, counting what it deleted (its summary's)."""

    def __init__(self, passed_on: Callable[[Any], Any] | None) -> None:
        self.count: int | None = None
        self._passed_on = passed_on

    def __call__(self, event: Any) -> None:
        if (summary := getattr(event, "summary_event", None)) is not None:
            self.count = sum(n for op, n in summary.resource_changes.items()
                             if getattr(op, "value", op) == "delete")
        if self._passed_on is not None:
            self._passed_on(event)


def _emptied(handle: ClusterStack) -> bool:
    """Whether the stack holds nothing now (False when that cannot be read: destroy)."""
    try:
        return handle.resource_count() == 0
    except Exception:  # noqa: BLE001 - unknown: the destroy goes ahead and says why it fails
        return False


def _finished_by_another(handle: ClusterStack, who: Destroyer) -> bool:
    """Whether another destroyer emptied the stack while ``who`` waited for its lock. Not for
    the stack's holder unless someone took it down (``down_by``): the lock it waited for may
    be its own dead engine's (an ``up`` a Ctrl+C killed) on a stack still empty, and its
    destroy, even of nothing, records how the run ended."""
    if handle.resource_count() != 0:
        return False
    return not who.holds or _taken_down(handle)


def _taken_down(handle: ClusterStack) -> bool:
    """Whether someone else took the stack down (tagged ``down_by``, as every destroyer from
    outside its pool does first)."""
    try:
        return bool(handle.tags().get(DOWN_BY))
    except Exception:  # noqa: BLE001 - unknown: record this destroy
        return False


def _look_at(handle: ClusterStack) -> tuple[StackRecord, Look]:
    """The stack's record (resources, tags) and a look at it from this machine now."""
    count = handle.resource_count()
    record = StackRecord(handle.name, handle.tags() if count else {}, count)
    return record, owners.look([record])



def _record(handle: ClusterStack, who: Destroyer, status: str, error: str = "") -> None:
    """Write the ``ended`` tag; a failure to is logged (the update's message says the rest)."""
    try:
        handle.add_tag(ENDED, ended_value(status, who.actor, who.source, who.via, who.reason,
                                          error))
    except Exception as exc:  # noqa: BLE001 - the record is best effort (a backend outage)
        log.warning("stack %s: recording how it ended failed: %s", handle.name, exc)
