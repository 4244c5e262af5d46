"""Stack programs: one per provider, each declaring a cluster from a ``ClusterRequest``.

Every program exports the same outputs, so everything after ``up`` is provider-independent:
``nodes`` (a list of ``{index, private_address, public_address, ssh_port, ssh_user, host_key,
workdir}``), ``ssh_private_key`` and ``agent_token`` (secrets).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

# Names for annotations only: the dynamic-provider process imports this package (as the parent of
# programs/local_node.py) on every `up` and `destroy`, and api/spec.py with pydantic would cost it
# ~0.4 s of CPU it never uses.
if TYPE_CHECKING:
    from skyward_iac.api.spec import Spec
    from skyward_iac.api.volumes import VolumeKeys
    from skyward_iac.infra.capacity.offers import Market, Offer


@dataclass(frozen=True, slots=True)
class ClusterRequest:
    """What one stack must declare: its name, the spec and how many nodes now.

    The optional fields matter to cloud providers only; their defaults let a program decide
    alone: ``offer`` (instance type and region, from ``offers.select``; default: the cheapest
    offer for ``spec``), ``market`` (force ``"on-demand"`` after spot capacity ran out under
    ``spot-if-available``; default: from ``spec.allocation``), ``max_lifetime`` (seconds; a hard
    cap on each node's life that the cloud enforces even if the node hangs; default: none) and
    ``created_at`` (stamps the ``expires_at`` tag; default: when the program is built).
    ``collections`` adds the etcd certificates (``ClusterPKI``) for the head node's etcd.
    ``on_demand_nodes``: indexes of nodes that run on demand although the market is spot (the
    cloud refused their spot launch; see ``infra/capacity/spot_fallback.py``). ``max_nodes``: the most
    nodes the pool may grow to (default: ``node_count``; placement is decided from it). A stack
    stores what its first run decided from these fields (``decisions.py``: place, zone, image,
    tags, lifetime, maximum) and later runs declare the stored values, so a resize, a fallback
    or another process's request never changes, and so never replaces, a running node.
    """

    stack_name: str
    spec: Spec
    node_count: int
    offer: Offer | None = None
    market: Market | None = None
    max_lifetime: int | None = None
    created_at: datetime | None = None
    collections: bool = True
    #: Resolved keys of keyed volumes by volume index; exported as a stack secret.
    volume_keys: Mapping[int, VolumeKeys] = field(default_factory=dict, repr=False)
    on_demand_nodes: frozenset[int] = frozenset()
    max_nodes: int | None = None
    #: The zone to use (capacity failover moved the pool there); None: the provider's choice.
    zone: str | None = None
    #: Zones single nodes were moved to after the cloud refused them in theirs (AWS pools
    #: without a placement group; see ``infra/capacity/spot_fallback.py``): node index -> zone.
    node_zones: Mapping[int, str] = field(default_factory=dict)
    #: The user's tags (``Options.tags``), on every resource beside skyward's own.
    tags: Mapping[str, str] = field(default_factory=dict)


def program_for(request: ClusterRequest) -> Callable[[], None]:
    """The inline Pulumi program that declares ``request``'s cluster.

    Cloud programs resolve their offer here, so a request nothing can serve fails before any
    stack exists.
    """
    from skyward_iac.infra.clouds import cloud  # the clouds import this package

    return cloud(request.spec.provider.kind).program(request)
