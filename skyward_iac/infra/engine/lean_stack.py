"""``LeanStack``: the Automation API's stack without the reads a pool never uses.

After every ``up``, ``refresh`` and ``destroy`` the Automation API starts two or three more
engine processes, each 0.1–0.3 s before it does anything: ``stack history --page-size 1`` for
an update summary, and after ``up`` the outputs twice (``stack output --json``, then again with
``--show-secrets``, only to learn which values are secret). A pool reads neither the summary
nor the secret flags, so here the outputs are read once, with their secrets, and no summary
is read at all. ``history()`` still reads the real update history.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pulumi.automation as auto
from pulumi.automation._stack import StackInitMode

from skyward_iac.same_user import guard_automation_servers

# The inline program's LanguageRuntime and the engine-events server this process starts for
# every engine command serve this user only.
guard_automation_servers()

#: What ``info()`` returns: a summary that says it was never read (``result="not read"``).
UNREAD_SUMMARY = auto.UpdateSummary(
    kind="update", start_time=datetime.fromtimestamp(0, UTC), message="", environment={},
    config={}, result="not read",
)


class LeanStack(auto.Stack):
    """An ``auto.Stack`` whose updates cost one engine process less or two (see module doc)."""

    @classmethod
    def create(cls, stack_name: str, workspace: auto.Workspace) -> LeanStack:
        """``pulumi stack init`` (the SDK's ``create`` always builds a plain ``Stack``)."""
        return cls(stack_name, workspace, StackInitMode.CREATE)

    @classmethod
    def select(cls, stack_name: str, workspace: auto.Workspace) -> LeanStack:
        """``pulumi stack select``; raises ``auto.errors.StackNotFoundError`` if it is missing."""
        return cls(stack_name, workspace, StackInitMode.SELECT)

    def info(self, show_secrets: bool = True) -> auto.UpdateSummary | None:
        """No command: ``UNREAD_SUMMARY`` (nothing here reads the latest update's summary;
        ``history()`` gives the real ones)."""
        return UNREAD_SUMMARY

    def outputs(self) -> auto.OutputMap:
        """The last ``up``'s outputs in one command (``--show-secrets``). Which of them are
        secret is not learned, so every value is marked secret: the safe side for a caller
        that would print them."""
        result = self._run_pulumi_cmd_sync(["stack", "output", "--json", "--show-secrets"])
        return {key: auto.OutputValue(value=value, secret=True)
                for key, value in json.loads(result.stdout or "{}").items()}
