"""One Pulumi stack per pool: create, up, destroy, and read its history and tags afterwards.

Stacks live in the file backend under the skyward home; a destroyed stack stays on record
(empty) so its update history can be read later, through this module or the ``pulumi`` CLI.
"""

from __future__ import annotations

import getpass
import logging
import re
import secrets
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pulumi.automation as auto

from skyward_iac.api.errors import ProvisionError, StackNotFoundError
from skyward_iac.api.spec import Spec
from skyward_iac.infra import engine, home
from skyward_iac.infra.programs import ClusterRequest, program_for

PROJECT = "skyward"
TAG_PREFIX = "skyward:"
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """How to reach one node after ``up``; the same shape for every provider."""

    index: int
    private_address: str
    public_address: str
    ssh_port: int
    ssh_user: str
    host_key: str
    workdir: str


@dataclass(frozen=True, slots=True)
class EtcdMaterial:
    """The head etcd's CA, server pair and client pair (PEM); secrets."""

    ca_pem: str
    server_cert_pem: str
    server_key_pem: str
    client_cert_pem: str
    client_key_pem: str

    def __repr__(self) -> str:
        return "EtcdMaterial(...)"


@dataclass(frozen=True, slots=True)
class ClusterOutputs:
    """A stack's outputs: its nodes plus the secrets needed to reach them."""

    nodes: tuple[NodeAddress, ...]
    ssh_private_key: str
    agent_token: str
    etcd: EtcdMaterial | None = None

    def __repr__(self) -> str:  # the secrets never reach a log line
        return f"ClusterOutputs(nodes={self.nodes!r})"


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


def stack_tags(spec: Spec, node_count: int, now: datetime | None = None) -> dict[str, str]:
    """The tags every stack carries, read by ``gc``, ``history`` and ops teams."""
    from skyward_iac import __version__

    now = now or datetime.now(UTC)
    return {
        "owner": f"{getpass.getuser()}@{socket.gethostname()}",
        "created_at": now.isoformat(timespec="seconds"),
        "expires_at": (now + timedelta(seconds=spec.ttl)).isoformat(timespec="seconds")
        if spec.ttl else "never",
        "ttl": str(spec.ttl),
        "provider": spec.provider.kind,
        "nodes": str(node_count),
        "version": __version__,
    }


def _workspace_options() -> auto.LocalWorkspaceOptions:
    found = engine.find_engine()
    return auto.LocalWorkspaceOptions(
        work_dir=str(home.workspace_dir()),
        pulumi_command=auto.PulumiCommand(root=str(found.root)),
        env_vars=engine.engine_env(found),
        project_settings=auto.ProjectSettings(
            name=PROJECT, runtime="python",
            backend=auto.ProjectBackend(url=f"file://{home.state_dir()}"),
        ),
    )


def _engine_error(action: str, stack: str, exc: Exception) -> ProvisionError:
    detail = getattr(exc, "stderr", "") or str(exc)
    tail = "\n".join(str(detail).strip().splitlines()[-15:])
    return ProvisionError(f"pulumi {action} of stack {stack!r} failed:\n{tail}")


class ClusterStack:
    """A handle on one pool's Pulumi stack."""

    def __init__(self, stack: auto.Stack) -> None:
        self._stack = stack

    @property
    def name(self) -> str:
        return self._stack.name

    @classmethod
    def create(cls, request: ClusterRequest, tags: Mapping[str, str]) -> ClusterStack:
        """Create a new stack for ``request`` and tag it; nothing is provisioned yet."""
        stack = auto.create_stack(
            request.stack_name, project_name=PROJECT, program=program_for(request),
            opts=_workspace_options(),
        )
        for key, value in tags.items():
            stack.set_tag(TAG_PREFIX + key, value)
        return cls(stack)

    @classmethod
    def select(cls, name: str) -> ClusterStack:
        """Open an existing stack (for destroy, history or gc); its program is never run."""
        try:
            stack = auto.select_stack(name, project_name=PROJECT, program=lambda: None,
                                      opts=_workspace_options())
        except auto.errors.StackNotFoundError:
            raise StackNotFoundError(
                f"no stack named {name!r} in {home.state_dir()} (is SKYWARD_HOME the same as when "
                "it was created?)"
            ) from None
        return cls(stack)

    def up(self, on_output: Callable[[str], Any] | None = None) -> ClusterOutputs:
        """Provision (or converge) the stack and return its outputs."""
        try:
            result = self._stack.up(on_output=on_output or log.debug, color="never")
        except auto.errors.CommandError as exc:
            raise _engine_error("up", self.name, exc) from None
        return _parse_outputs(result.outputs)

    def outputs(self) -> ClusterOutputs:
        """The outputs of the last successful ``up``."""
        return _parse_outputs(self._stack.outputs())

    def destroy(self, on_output: Callable[[str], Any] | None = None) -> None:
        """Delete every resource of the stack; the stack itself stays on record."""
        try:
            self._stack.destroy(on_output=on_output or log.debug, color="never")
        except auto.errors.CommandError as exc:
            raise _engine_error("destroy", self.name, exc) from None

    def preview(self, on_output: Callable[[str], Any] | None = None) -> Plan:
        """Run ``pulumi preview --diff`` and return what an ``up`` would change; nothing is."""
        steps: dict[str, auto.StepEventMetadata] = {}

        def on_event(event: auto.EngineEvent) -> None:
            if event.resource_pre_event is not None:
                step = event.resource_pre_event.metadata
                # A replacement is three steps for one URN; keep the one that names it.
                if step.urn not in steps or step.op == auto.OpType.REPLACE:
                    steps[step.urn] = step

        try:
            result = self._stack.preview(on_output=on_output or log.debug, on_event=on_event,
                                         diff=True, color="never")
        except auto.errors.CommandError as exc:
            raise _engine_error("preview", self.name, exc) from None
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
        deployment = self._stack.export_stack().deployment or {}
        return sum(
            1 for r in deployment.get("resources", [])
            if not r["type"].startswith("pulumi:")
        )

    def history(self) -> list[auto.UpdateSummary]:
        """Every update, newest first (up, destroy, refresh ...)."""
        return self._stack.history(show_secrets=False)

    def tags(self) -> dict[str, str]:
        """The skyward tags, without their prefix."""
        tags = self._stack.workspace.list_tags(self.name)
        return {k.removeprefix(TAG_PREFIX): v for k, v in tags.items() if k.startswith(TAG_PREFIX)}


def _parse_outputs(outputs: Mapping[str, auto.OutputValue]) -> ClusterOutputs:
    nodes = tuple(
        NodeAddress(
            index=int(n["index"]), private_address=n["private_address"],
            public_address=n["public_address"], ssh_port=int(n["ssh_port"]),
            ssh_user=n["ssh_user"], host_key=n["host_key"], workdir=n["workdir"],
        )
        for n in outputs["nodes"].value
    )
    etcd = outputs.get("etcd")
    return ClusterOutputs(
        nodes=nodes,
        ssh_private_key=outputs["ssh_private_key"].value,
        agent_token=outputs["agent_token"].value,
        etcd=EtcdMaterial(**etcd.value) if etcd is not None else None,
    )
