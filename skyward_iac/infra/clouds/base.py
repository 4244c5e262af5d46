"""What one provider decides, as one object (``Cloud``): asked of it instead of branching on
the provider's kind wherever the answer is needed.

A subclass per provider (``local.py``, ``aws.py``, ``gcp.py``) holds its answers: the stack
program that declares a pool, the stack config it pins at creation, where its credentials come
from, whether a refused node may move to a sibling zone alone. ``clouds.cloud(kind)`` gives the
one for a kind. The heavy provider SDKs are imported only when a method needs them, so asking
an AWS question never loads pulumi_gcp.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from skyward_iac.api.errors import ConfigError

if TYPE_CHECKING:
    from skyward_iac.infra.pricing.document import RefreshedCatalog
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
    #: Learning who its credentials authenticate as costs a call to the cloud (AWS: STS), so
    #: ``cloud_identity.known_actor`` gives only what this process learned already.
    actor_costs_a_call: ClassVar[bool] = False

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

    def find_actor(self) -> tuple[str, str] | None:
        """Who its credentials authenticate as, and how that is known (``tags.ACTOR_SOURCE``);
        None: nobody the cloud vouches for (the audit's actor is then self-declared)."""
        return None

    def pricing_auth(self) -> Any:
        """What its live pricing APIs need, found (or refused with a ``ConfigError``) before
        any catalog is fetched; None: nothing beyond the SDK's own credentials."""
        raise ConfigError(f"{self.kind} has no pricing APIs: its offers are not a catalog's")

    def fetch_catalog(self, shipped: dict[str, Any], regions: Sequence[str] | None,
                      auth: Any) -> RefreshedCatalog:
        """Its catalog rebuilt from its live pricing APIs, in ``shipped``'s format."""
        raise ConfigError(f"{self.kind} has no pricing APIs: its offers are not a catalog's")

    def data_bind(self, private_address: str) -> str | None:
        """Where a node's agent listens for its data port (node/data_port.py ``endpoint``:
        ``ADDR`` or ``ADDR:PORT``), given the node's private address; None: the node has
        no data port (its firewall opens none)."""
        return None

    def nodes_move_alone(self, request: ClusterRequest) -> bool:
        """Whether a node refused in its zone may be declared in a sibling zone while the
        pool's other nodes stay where they run."""
        return False
