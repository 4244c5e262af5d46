"""The tag half of ``ClusterStack``: reading a stack's tags and writing them in their stored
form (``tags.encode_tags``), each write one engine command and no stack update, so it never
waits for or blocks the owner's updates; a new stack's first tags in one write on a file
backend (``engine/state_tags.py``)."""

from __future__ import annotations

from collections.abc import Mapping

import pulumi.automation as auto

from skyward_iac.infra.engine.lean_stack import LeanStack
from skyward_iac.infra.engine.state_tags import write_first_tags
from skyward_iac.infra.stacks import home, usage
from skyward_iac.infra.stacks.leases import LEASE_UNTIL
from skyward_iac.infra.stacks.records import PROJECT
from skyward_iac.infra.stacks.tags import (
    DOWN_BY,
    SEGMENTS,
    TAG_PREFIX,
    WARM_UNTIL,
    chunk_keys,
    decode_tags,
    encode_tags,
    skyward_tags,
)


def tag_new_stack(stack: LeanStack, tags: Mapping[str, str]) -> None:
    """Give the stack ``stack init`` just made its first ``tags`` (without their prefix): on a
    file backend all in one write (``write_first_tags``), else one engine command each."""
    stored = {TAG_PREFIX + key: value for key, value in encode_tags(tags).items()}
    backend_dir = home.file_backend()
    if backend_dir is None or not write_first_tags(backend_dir, PROJECT, stack.name, stored):
        for key, value in stored.items():
            stack.set_tag(key, value)


class StackTags:
    """A stack's skyward tags (``ClusterStack`` gives the stack and its name)."""

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def _stack(self) -> LeanStack:
        raise NotImplementedError

    def mark_taken_down(self, by: str) -> None:
        """Tag the stack as destroyed from outside its pool (before destroying it), so its
        owner, if it still runs, stops instead of recreating its nodes."""
        self._stack.set_tag(TAG_PREFIX + DOWN_BY, by)

    def renew_lease(self, until: str) -> None:
        """Move the stack's lease forward to ``until`` (ISO time): ``gc`` leaves it alone."""
        self._stack.set_tag(TAG_PREFIX + LEASE_UNTIL, until)

    def set_warm(self, until: str | None) -> None:
        """Tag the stack as kept warm until ``until`` (ISO time), or no longer (None)."""
        if until:
            self._stack.set_tag(TAG_PREFIX + WARM_UNTIL, until)
        else:
            try:
                self._stack.remove_tag(TAG_PREFIX + WARM_UNTIL)
            except auto.errors.CommandError:
                pass  # it had none

    def update_tags(self, changes: Mapping[str, str]) -> None:
        """Rewrite some of the stack's tags (``nodes``, ``usd_per_hour`` after a resize) in
        their stored form; only the stored tags that change are written, chunks no longer
        used are removed. ``segments`` add to the stored ones (``usage.merge``: a warm pool's
        earlier runs stay)."""
        stored = {key.removeprefix(TAG_PREFIX): value
                  for key, value in self._stack.workspace.list_tags(self.name).items()
                  if key.startswith(TAG_PREFIX)}
        current = decode_tags(stored)
        changes = dict(changes)
        if SEGMENTS in changes:
            changes[SEGMENTS] = usage.encode(usage.merge(
                usage.decode(current.get(SEGMENTS, "")), usage.decode(changes[SEGMENTS])))
        wanted = encode_tags({**current, **changes})
        for key, value in wanted.items():
            if stored.get(key) != value:
                self._stack.set_tag(TAG_PREFIX + key, value)
        for key in chunk_keys(stored) - set(wanted):
            self._stack.remove_tag(TAG_PREFIX + key)

    def add_tag(self, key: str, value: str) -> None:
        """Write one tag of its own (``key`` without the prefix: an access entry); one engine
        command, no update, so it never waits for or blocks the owner's updates."""
        self._stack.set_tag(TAG_PREFIX + key, value)

    def tags(self) -> dict[str, str]:
        """The skyward tags, without their prefix."""
        return skyward_tags(self._stack.workspace.list_tags(self.name))
