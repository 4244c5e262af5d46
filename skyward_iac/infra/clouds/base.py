"""What one provider decides, as one object (``Cloud``): asked of it instead of branching on
the provider's kind wherever the answer is needed.

A subclass per provider (``local.py``, ``aws.py``, ``gcp.py``) holds its answers: the stack
program that declares a pool, the stack config it pins at creation, where its credentials come
from, whether a refused node may move to a sibling zone alone. ``clouds.cloud(kind)`` gives the
one for a kind. The heavy provider SDKs are imported only when a method needs them, so asking
an AWS question never loads pulumi_gcp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from skyward_iac.infra.programs import ClusterRequest
    from skyward_iac.infra.programs.pins import Resolvers


class Cloud:
    """One provider's answers; the defaults are those of a provider that has none to give."""

    kind: ClassVar[str]
    #: Nodes are sandboxes on this machine: no catalog, cloud account, credentials or pins.
    on_this_machine: ClassVar[bool] = False
    #: Where its credentials may come from, as a missing-credentials error lists them.
    credential_sources: ClassVar[tuple[str, ...]] = ()
    #: The stack config keys (``skyward:<key>``) its stacks pin or decide (``pins.py``).
    pin_keys: ClassVar[tuple[str, ...]] = ()

    def program(self, request: ClusterRequest) -> Callable[[], None]:
        """The inline Pulumi program declaring ``request``'s cluster (the offer is resolved
        now, so a request nothing serves fails before any stack exists)."""
        raise NotImplementedError

    def stack_pins(self, request: ClusterRequest, resolvers: Resolvers) -> dict[str, str]:
        """What a new stack for ``request`` stores at creation, each resolved once."""
        return {}

    def credential_source(self) -> str | None:
        """Where this machine's credentials for the cloud come from; None: it has none."""
        return None

    def nodes_move_alone(self, request: ClusterRequest) -> bool:
        """Whether a node refused in its zone may be declared in a sibling zone while the
        pool's other nodes stay where they run."""
        return False
