"""``LeanStack``: the Automation API's stack without the reads a pool never uses.

After every ``up``, ``refresh`` and ``destroy`` the Automation API starts two or three more
engine processes, each 0.1–0.3 s before it does anything: ``stack history --page-size 1`` for
an update summary, and after ``up`` the outputs twice (``stack output --json``, then again with
``--show-secrets``, only to learn which values are secret). A pool reads neither the summary
nor the secret flags, so here no summary is read at all, and the outputs of an ``up`` whose
program ran in this process (inline) are the values that program exported, as the engine
stored them: the stack's outputs are what the program registers at its end (the SDK's
``Stack._finish``: ``register_outputs`` of its exports), resolved in this process before the
program's run ends (``wait_for_rpcs`` awaits every output). That saves the ``stack output
--show-secrets`` start too, 0.5 CPU-s with the passphrase (its key derivation). When they
could not be taken so (an export not known), they are read once, with their secrets.
``history()`` still reads the real update history.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pulumi
import pulumi.automation as auto
from pulumi.automation._stack import StackInitMode
from pulumi.runtime.settings import get_root_resource

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

    #: The exports of the ``up`` under way, recorded by its program.
    _exported: Exports | None = None

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

    def up(self, *args: Any, program: auto.PulumiFn | None = None,
           **kwargs: Any) -> auto.UpResult:
        """``auto.Stack.up``, whose outputs are those the program exported here (module doc)."""
        inner = program or self.workspace.program
        if inner is None:
            return super().up(*args, **kwargs)
        self._exported = Exports()
        try:
            return super().up(*args, program=self._exported.recording(inner), **kwargs)
        finally:
            self._exported = None

    def outputs(self) -> auto.OutputMap:
        """The outputs of the ``up`` under way as its program exported them, else the last
        ``up``'s outputs in one command (``--show-secrets``). Which of them are secret is not
        learned, so every value is marked secret: the safe side for a caller that would print
        them."""
        exported = self._exported
        if exported is not None and exported.values is not None:
            values = exported.values
        else:
            result = self._run_pulumi_cmd_sync(["stack", "output", "--json", "--show-secrets"])
            values = json.loads(result.stdout or "{}")
        return {key: auto.OutputValue(value=value, secret=True) for key, value in values.items()}


class Exports:
    """What an inline program exported, once every value of it is known (``values``)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] | None = None

    def recording(self, program: Callable[[], Any]) -> Callable[[], Any]:
        """``program``, which then also keeps its stack's exports, resolved, in ``values``."""

        def run() -> Any:
            self.values = None
            result = program()
            root = get_root_resource()
            exports = getattr(root, "outputs", None)
            if inspect.isawaitable(result) or not isinstance(exports, dict):
                return result  # exports still to come, or an SDK without them: ask the engine
            # A JSON round trip, as the engine's state gives them back (tuples become lists).
            pulumi.Output.from_input(dict(exports)).apply(self._keep)
            return result

        return run

    def _keep(self, values: dict[str, Any]) -> None:
        try:  # never fails the program: without values the engine is asked
            # As the engine stores them: an export of None is no output (the SDK's
            # serialize_properties drops it; a None inside a value stays).
            self.values = {key: value for key, value in json.loads(json.dumps(values)).items()
                           if value is not None}
        except (TypeError, ValueError):
            self.values = None
