"""One Pulumi stack per pool: create, up, destroy, and read its history and tags afterwards.

Stacks live in the file backend under the skyward home; a destroyed stack stays on record
(empty) so its update history can be read later, through this module or the ``pulumi`` CLI.
"""

from __future__ import annotations

import functools
import getpass
import json
import logging
import os
import re
import secrets
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pulumi.automation as auto

from skyward_iac.api.errors import ProvisionError, StackBusyError, StackNotFoundError
from skyward_iac.api.spec import Spec
from skyward_iac.infra.clouds import cloud_of_stack
from skyward_iac.infra.engine import locate as engine
from skyward_iac.infra.engine.command import EngineCommand
from skyward_iac.infra.engine.lean_stack import LeanStack
from skyward_iac.infra.engine.state_repair import repair as repair_state
from skyward_iac.infra.identity import cloud_identity
from skyward_iac.infra.programs import ClusterRequest, program_for
from skyward_iac.infra.programs.decisions import StackProgram
from skyward_iac.infra.programs.pins import NODES, ZONE, config_values, stack_pins
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.fallbacks import ResourceErrors, fallback_for
from skyward_iac.infra.stacks.records import (  # noqa: F401 - re-exported: callers list here
    PROJECT,
    list_records,
    managed_count,
)
from skyward_iac.infra.stacks.stack_secrets import adopt_secrets_settings
from skyward_iac.infra.stacks.stack_tags import StackTags, tag_new_stack
from skyward_iac.infra.stacks.tags import (
    ACTOR,
    ACTOR_SOURCE,
    SELF_DECLARED,
    with_actor,
)
from skyward_iac.outputs import ClusterOutputs, parse_outputs
from skyward_iac.processes import is_alive

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PlannedResource:
    """One resource a preview would touch: the operation, its Pulumi type and name."""

    op: str  # create, update, replace, delete, same, read ...
    type: str
    name: str
    urn: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``pulumi preview`` says an update of the stack would do.

    ``resources`` and ``changes`` (counts by operation) leave out the stack itself and
    provider resources, as ``resource_count`` does; ``text`` is the engine's own diff.
    """

    stack: str
    resources: tuple[PlannedResource, ...]
    text: str

    @property
    def changes(self) -> dict[str, int]:
        """Resources per operation, e.g. ``{"create": 3}``."""
        counts: dict[str, int] = {}
        for resource in self.resources:
            counts[resource.op] = counts.get(resource.op, 0) + 1
        return counts

    def of_type(self, suffix: str) -> list[PlannedResource]:
        """The planned resources whose type ends with ``suffix`` (``"LocalNode"``)."""
        return [r for r in self.resources if r.type.endswith(suffix)]


def new_stack_name(spec: Spec, now: datetime | None = None) -> str:
    """``<provider>-<owner>-<UTC timestamp>-<random>``: readable, sortable and unique."""
    now = now or datetime.now(UTC)
    owner = re.sub(r"[^A-Za-z0-9_.-]", "-", getpass.getuser())[:32]
    return f"{spec.provider.kind}-{owner}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def _project_dir() -> str:
    """The workspace with its ``Pulumi.yaml``, written once and atomically.

    A LocalWorkspace given project settings rewrites Pulumi.yaml every time; two threads or
    processes doing that at once (a pool starting while gc runs) interleave their writes.
    """
    work_dir = home.workspace_dir()
    project = work_dir / "Pulumi.yaml"
    text = f"name: {PROJECT}\nruntime: python\nbackend:\n  url: {home.backend_url()}\n"
    if not project.exists() or project.read_text() != text:
        tmp = work_dir / f".Pulumi.yaml.{os.getpid()}.{threading.get_ident()}"
        tmp.write_text(text)
        tmp.replace(project)
    return str(work_dir)


@functools.cache
def _command(root: str, version: str) -> auto.PulumiCommand:
    """One command object per engine, checked on the version ``find_engine`` read."""
    return EngineCommand(root=root, version=version)


def _workspace(program: auto.PulumiFn | None = None,
               secrets_provider: str | None = None) -> auto.LocalWorkspace:
    """A workspace on the project directory and the engine, running ``program`` inline."""
    found = engine.find_engine()
    return auto.LocalWorkspace(
        work_dir=_project_dir(), pulumi_command=_command(str(found.root), found.version),
        env_vars=engine.engine_env(found), program=program, secrets_provider=secrets_provider,
    )


def workspace_for_listing() -> auto.LocalWorkspace:
    """A workspace for reading the backend's stacks through the engine (``records.py``)."""
    return _workspace()




def _select(name: str) -> LeanStack:
    try:
        return LeanStack.select(name, _workspace(program=lambda: None))
    except auto.errors.StackNotFoundError:
        raise StackNotFoundError(
            f"no stack named {name!r} in {home.backend_url()} (are SKYWARD_HOME and "
            "SKYWARD_BACKEND_URL the same as when it was created?)"
        ) from None


def _engine_error(action: str, stack: str, exc: Exception) -> ProvisionError:
    detail = getattr(exc, "stderr", "") or str(exc)
    tail = "\n".join(str(detail).strip().splitlines()[-15:])
    return ProvisionError(f"pulumi {action} of stack {stack!r} failed:\n{tail}")


class ClusterStack(StackTags):
    """A handle on one pool's Pulumi stack."""

    def __init__(self, stack: LeanStack | None, name: str | None = None) -> None:
        self._resolved = stack
        self._name = name or (stack.name if stack is not None else "")
        self._resolving = threading.Lock()
        #: The provider of the stack's nodes when known (a created stack), for its actor.
        self._provider: str | None = None
        #: An engine update plan the next ``up`` must follow (a reviewed plan), then none.
        self.plan_file: Path | None = None
        #: Whether the workspace was checked for the stack's secrets settings (``_writable``).
        self._secrets_checked = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def _stack(self) -> LeanStack:
        """The Automation API stack, selected on first use for a lazy handle."""
        with self._resolving:
            if self._resolved is None:
                self._resolved = _select(self._name)
            return self._resolved

    @property
    def _writable(self) -> LeanStack:
        """The stack, for a command that writes its state: on a machine that never had its
        secrets settings (a teammate's), they are taken from the state first."""
        stack = self._stack
        if not self._secrets_checked:
            adopt_secrets_settings(stack)
            self._secrets_checked = True
        return stack

    @classmethod
    def create(cls, request: ClusterRequest, tags: Mapping[str, str]) -> ClusterStack:
        """Create a new stack for ``request`` and tag it; nothing is provisioned yet.

        A cloud stack also stores its pins (``programs/pins.py``: SSH CIDR, AWS account, GCP
        project), resolved here and never again for this stack.
        """
        # Before the stack exists: a pin that cannot be learned leaves nothing behind.
        pinned = stack_pins(request, cloud_identity.RESOLVERS)
        # Who runs it: on a cloud, the identity its credentials authenticated (STS answered
        # it with the account pin above); on Local the owner, self-declared.
        actor, source = cloud_identity.known_actor(request.spec.provider.kind)
        if source != SELF_DECLARED:
            tags = {**tags, ACTOR: actor, ACTOR_SOURCE: source}
        # A secrets provider such as awskms:// keeps keys out of the state in plaintext.
        workspace = _workspace(program_for(request), home.secrets_provider())
        stack = LeanStack.create(request.stack_name, workspace)
        if pinned:
            stack.set_all_config({key: auto.ConfigValue(value)
                                  for key, value in config_values(pinned).items()})
        tag_new_stack(stack, tags)
        created = cls(stack)
        created._provider = request.spec.provider.kind
        return created

    @classmethod
    def select(cls, name: str, lazy: bool = False) -> ClusterStack:
        """Open an existing stack (for destroy, history or gc); its program is never run.
        ``lazy``: the engine is asked only when the handle is first used (a warm pool's
        adopter needs none of it to start working)."""
        return cls(None, name) if lazy else cls(_select(name))

    def up(self, on_output: Callable[[str], Any] | None = None, refresh: bool = False,
           message: str | None = None,
           on_event: Callable[[auto.EngineEvent], Any] | None = None,
           replace_nodes: Sequence[int] = ()) -> ClusterOutputs:
        """Provision (or converge) the stack and return its outputs; ``refresh`` first reads
        every resource back, so a node that vanished is noticed and created again;
        ``replace_nodes`` are recreated even though they still exist (unhealthy, preempted).
        A failure the program can do without (``fallbacks.py``) is stored and warned about,
        and the update runs again (never under a reviewed plan)."""
        message = self.audited(message or "skyward: update")
        plan, self.plan_file = self.plan_file, None  # a reviewed plan binds the first up only
        errors = ResourceErrors(on_event)
        try:
            result = self._writable.up(on_output=on_output or log.debug, color="never",
                                    refresh=refresh, message=message, on_event=errors,
                                    replace=self._node_urns(replace_nodes) or None,
                                    plan=str(plan) if plan else None)
        except auto.errors.CommandError as exc:
            fallback = None if plan else fallback_for(self._stack.workspace.program,
                                                      errors.by_name)
            if fallback is None:
                raise _engine_error("up", self.name, exc) from None
            log.warning(fallback.warning)
            self._stack.set_all_config({key: auto.ConfigValue(value) for key, value
                                        in config_values(fallback.values).items()})
            return self.up(on_output, refresh, message, on_event, replace_nodes)
        self._store_decisions()
        return parse_outputs(result.outputs)

    def _store_decisions(self) -> None:
        """Store in the stack's config what the program decided for good in the engine run
        that just succeeded (programs/decisions.py: image, zone, place, each node's image),
        so later runs, from any process, declare the same; one engine command, only when a
        run decided something new (the first update, a resize)."""
        program = self._stack.workspace.program
        values = program.unstored() if isinstance(program, StackProgram) else {}
        if values:
            self._stack.set_all_config({key: auto.ConfigValue(value)
                                        for key, value in config_values(values).items()})

    def _node_urns(self, indexes: Sequence[int]) -> list[str]:
        """The URNs of the instances declared as ``node-<index>`` (every provider names them so)."""
        if not indexes:
            return []
        names = {f"node-{index}" for index in indexes}
        resources = (self._stack.export_stack().deployment or {}).get("resources", [])
        return [r["urn"] for r in resources
                if r.get("urn", "").rsplit("::", 1)[-1] in names and not r.get("delete")]

    def audited(self, message: str) -> str:
        """``message`` naming who makes the update (``tags.with_actor``): so the stack's own
        update history (``pulumi stack history``) says who did what and why."""
        return with_actor(message, *cloud_identity.actor(self._provider or
                                                         cloud_of_stack(self.name).kind))

    def zones(self) -> tuple[str, ...]:
        """The zones the stack's last update placed its nodes in, as its program decided and
        recorded them (``decisions.py``); none for Local, or before an update ran here."""
        program = self._resolved.workspace.program if self._resolved is not None else None
        recorder = getattr(program, "recorder", None) if isinstance(program, StackProgram) \
            else None
        if recorder is None:
            return ()
        values = {**recorder.stored, **recorder.values}
        zones = {values.get(ZONE) or ""}
        try:
            zones |= {str(pin.get("zone") or "") for pin in json.loads(values.get(NODES)
                                                                       or "{}").values()}
        except (ValueError, AttributeError):
            pass
        return tuple(sorted(zone for zone in zones if zone))

    def set_request(self, request: ClusterRequest) -> None:
        """Declare ``request`` from now on (e.g. another node count); the next ``up`` applies it."""
        self._stack.workspace.program = program_for(request)

    def outputs(self) -> ClusterOutputs:
        """The outputs of the last successful ``up``."""
        return parse_outputs(self._stack.outputs())

    def destroy(self, on_output: Callable[[str], Any] | None = None,
                message: str = "skyward: pool closed",
                on_event: Callable[[auto.EngineEvent], Any] | None = None) -> None:
        """Delete every resource of the stack; the stack itself stays on record, and
        ``message`` (how the run ended) stays in its update history."""
        message = self.audited(message)
        try:
            self._writable.destroy(on_output=on_output or log.debug, color="never",
                                   message=message, on_event=on_event)
        except auto.errors.ConcurrentUpdateError:
            raise StackBusyError(f"stack {self.name!r} is locked by another update") from None
        except auto.errors.CommandError as exc:
            raise _engine_error("destroy", self.name, exc) from None

    def stale_locks(self) -> list[Path]:
        """Lock files of this stack left by processes that died on this host."""
        directory = home.file_backend()
        if directory is None:
            return []  # other backends: the engine's own lock handling (`pulumi cancel`)
        root = directory / ".pulumi" / "locks" / "organization" / PROJECT / self.name
        stale = []
        for lock in root.glob("*.json"):
            try:
                holder = json.loads(lock.read_text())
            except (OSError, ValueError):
                continue
            same_host = holder.get("hostname") == socket.gethostname()
            if same_host and not is_alive(int(holder.get("pid", 0))):
                stale.append(lock)
        return stale

    def clear_crash_leftovers(self) -> None:
        """Undo what a crashed update leaves: broken state files (``state_repair``), a stale
        lock (``cancel``, only when its holder is dead) and pending operations or resources
        that vanished (``refresh``)."""
        if (directory := home.file_backend()) is not None:
            repair_state(directory)
        if self.stale_locks():
            self._stack.cancel()
        try:
            self._writable.refresh(clear_pending_creates=True, color="never", on_output=log.debug,
                                   message=self.audited("skyward: refresh before cleanup"))
        except auto.errors.ConcurrentUpdateError:
            raise StackBusyError(f"stack {self.name!r} is locked by another update") from None
        except auto.errors.CommandError as exc:
            raise _engine_error("refresh", self.name, exc) from None

    def preview(self, on_output: Callable[[str], Any] | None = None,
                save_plan: Path | None = None) -> Plan:
        """Run ``pulumi preview --diff`` and return what an ``up`` would change; nothing is.
        ``save_plan``: also write the engine's update plan there (``--save-plan``)."""
        steps: dict[str, auto.StepEventMetadata] = {}

        def on_event(event: auto.EngineEvent) -> None:
            if event.resource_pre_event is not None:
                step = event.resource_pre_event.metadata
                # A replacement is three steps for one URN; keep the one that names it.
                if step.urn not in steps or step.op == auto.OpType.REPLACE:
                    steps[step.urn] = step

        try:
            result = self._writable.preview(on_output=on_output or log.debug, on_event=on_event,
                                         diff=True, color="never",
                                         plan=str(save_plan) if save_plan else None)
        except auto.errors.CommandError as exc:
            raise _engine_error("preview", self.name, exc) from None
        self._store_decisions()  # the apply of a reviewed plan must declare what it previewed
        # Events arrive in the engine's (parallel) order; sort so two previews read the same.
        resources = tuple(sorted(
            (PlannedResource(op=str(step.op.value), type=step.type,
                             name=step.urn.rsplit("::", 1)[-1], urn=step.urn)
             for step in steps.values() if not step.type.startswith("pulumi:")),
            key=lambda r: (r.type, r.name),
        ))
        return Plan(stack=self.name, resources=resources, text=result.stdout)

    def remove(self) -> None:
        """Delete the stack, its history and backups from the backend; it must be empty."""
        workspace = self._stack.workspace
        assert isinstance(workspace, auto.LocalWorkspace)
        # Workspace.remove_stack cannot pass --remove-backups, which leaves <stack>.json.bak.
        args = ["stack", "rm", "--yes", "--remove-backups", self.name]
        try:
            workspace.pulumi_command.run(args, workspace.work_dir, workspace.env_vars)
        except auto.errors.CommandError as exc:
            raise _engine_error("stack rm", self.name, exc) from None

    def resource_count(self) -> int:
        """Resources currently in the stack's state, the stack itself and providers excluded."""
        return managed_count(self._stack.export_stack().deployment or {})

    def history(self) -> list[auto.UpdateSummary]:
        """Every update, newest first (up, destroy, refresh ...)."""
        return self._stack.history(show_secrets=False)
