"""The access log of a stack: who opened a shell, ran a command, forwarded a port or copied a
file on its nodes (``skyward-iac ssh``, ``forward``, ``cp``), and when.

Each entry is a tag of its own, ``skyward:access.<UTC time>`` = ``<user@host> <what>``. A tag
costs one engine command and no stack update: it takes no lock, so it never waits for the
owner's updates nor makes them fail, it works on every backend (a shared one included), and it
stays after the stack is destroyed, beside the update history. ``show`` lists the entries and
``history --json`` carries them. The time is the recording machine's clock. ``pool.forward``
records its forwards too (``record_later``).

What is recorded is the action, never a command's arguments (they may hold a secret): ``ssh``
records the program's name only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from skyward_iac.infra.stacks.tags import ACCESS, MAX_TAG_VALUE, local_actor

__all__ = ["ACCESS", "AccessEntry", "actor", "entries", "entry_tag", "listing", "record",
           "record_later"]

if TYPE_CHECKING:
    from skyward_iac.infra.stacks.stack import ClusterStack

log = logging.getLogger("skyward")

_STAMP = "%Y%m%dT%H%M%S"


@dataclass(frozen=True, slots=True)
class AccessEntry:
    """One recorded action: when (ISO, UTC), by whom (``user@host``) and what."""

    at: str
    by: str
    action: str


#: This user on this machine, as the access log names them.
actor = local_actor


def entry_tag(action: str, by: str, now: datetime) -> tuple[str, str]:
    """The tag (key without the ``skyward:`` prefix, value) recording ``action`` at ``now``;
    microseconds keep two entries of one second apart (the key stays within 40 characters)."""
    now = now.astimezone(UTC)
    key = f"{ACCESS}{now.strftime(_STAMP)}.{now.microsecond:06d}Z"
    return key, f"{by} {action}"[:MAX_TAG_VALUE]


def entries(tags: Mapping[str, str]) -> list[AccessEntry]:
    """The access entries among a stack's (decoded) tags, newest first."""
    found: list[tuple[datetime, AccessEntry]] = []
    for key, value in tags.items():
        if not key.startswith(ACCESS):
            continue
        stamp, _, fraction = key.removeprefix(ACCESS).rstrip("Z").partition(".")
        try:
            when = datetime.strptime(stamp, _STAMP).replace(tzinfo=UTC,
                                                             microsecond=int(fraction or 0))
        except ValueError:
            continue  # not one of ours
        by, _, action = value.partition(" ")
        found.append((when, AccessEntry(when.isoformat(timespec="seconds"), by, action)))
    return [entry for _, entry in sorted(found, key=lambda pair: pair[0], reverse=True)]


def listing(tags: Mapping[str, str]) -> list[dict[str, str]]:
    """``entries`` as plain records (``show --json``, ``history --json``)."""
    return [asdict(entry) for entry in entries(tags)]


def record(stack: ClusterStack, action: str, now: datetime | None = None) -> None:
    """Add an entry for ``action`` by this user to ``stack``'s access log.

    The engine writes a stack's tags as a whole (read, change one, write all back), so a tag
    written by the owner at the same moment (a lease renewal) can drop this one: it is read
    back and written once more if it is missing."""
    key, value = entry_tag(action, actor(), now or datetime.now(UTC))
    for _ in range(2):
        stack.add_tag(key, value)
        if stack.tags().get(key) == value:
            return
    log.warning("stack %s: the access entry %r did not stay in its tags", stack.name, value)


def record_later(stack: str, action: str) -> threading.Thread:
    """``record`` in a thread of its own, for the owner's pool (``pool.forward``): its engine
    commands stay off the action's path, and a failure is logged, never raised into the
    user's code."""
    from skyward_iac.infra.stacks.stack import ClusterStack

    def write() -> None:
        try:
            record(ClusterStack.select(stack, lazy=True), action)
        except Exception as exc:  # noqa: BLE001 - the forward works without its entry
            log.warning("stack %s: this access (%s) was not recorded in its access log: %s",
                        stack, action, exc)

    thread = threading.Thread(target=write, name="skyward-access-log", daemon=True)
    thread.start()
    return thread
