"""Stack programs: one per provider, each declaring a cluster from a ``ClusterRequest``.

Every program exports the same outputs, so everything after ``up`` is provider-independent:
``nodes`` (a list of ``{index, private_address, public_address, ssh_port, ssh_user, host_key,
workdir}``), ``ssh_private_key`` and ``agent_token`` (secrets).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.spec import Spec


@dataclass(frozen=True, slots=True)
class ClusterRequest:
    """What one stack must declare: its name, the spec and how many nodes now."""

    stack_name: str
    spec: Spec
    node_count: int


def program_for(request: ClusterRequest) -> Callable[[], None]:
    """The inline Pulumi program that declares ``request``'s cluster."""
    kind = request.spec.provider.kind
    if kind == "local":
        from skyward_iac.infra.programs.local import local_program

        return local_program(request)
    raise ConfigError(
        f"provider {kind!r} has no stack program in this version yet; use sky.Local()"
    )
