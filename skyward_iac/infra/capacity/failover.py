"""Capacity failover: where a new pool goes when the cloud has no capacity where it asked.

When the first ``up`` of a pool fails because the cloud refused capacity for its nodes (after
the spot -> on-demand fallback of ``spot_fallback.py``), the pool tries, in order: the next zone
of the region offering the type (GCP; AWS picks its zone from the live offerings), then the next
region offering the same instance type (cheapest listed price first), then the next Spec of a
multi-spec ``Compute`` (in the order ``Options.selection`` ranks them), each as one more stack
update with a ``sky.ProvisionRetried`` event saying why. Only a pool none of whose nodes exists
moves: moving a stack with running nodes would replace them. The order is a pure function of
the request and the catalog; ``lifecycle``/``reconciler`` run it, bounded by
``Options(max_provision_attempts, provision_retry_delay, provision_timeout)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from skyward_iac.api.errors import ProvisionError
from skyward_iac.infra.capacity.offers import Catalog, Choice, Offer, current_catalog
from skyward_iac.infra.programs import ClusterRequest

#: Error texts meaning "no capacity (or quota) for this request here", on either market.
CAPACITY_ERRORS = (
    "InsufficientInstanceCapacity",  # AWS, spot or on demand
    "InstanceLimitExceeded", "VcpuLimitExceeded",  # AWS quotas
    "Unsupported: Your requested instance type",  # AWS: the type is not offered in that zone
    "ZONE_RESOURCE_POOL_EXHAUSTED",  # GCP (also ..._WITH_DETAILS)
    "does not have enough resources available to fulfill the request",
    "QUOTA_EXCEEDED", "Quota '",  # GCP quotas (GPUS_ALL_REGIONS, NVIDIA_*_GPUS, CPUS ...)
)


def capacity_refused(message: str) -> bool:
    """Whether an engine error says the cloud has no capacity or quota for the request."""
    lowered = message.lower()
    return any(marker.lower() in lowered for marker in CAPACITY_ERRORS)


@dataclass(frozen=True, slots=True)
class Alternative:
    """One more place to try: the request for it and why (for the event and the log)."""

    request: ClusterRequest
    why: str

    @property
    def where(self) -> str:
        offer = self.request.offer
        assert offer is not None
        return f"{offer.region}{f' ({self.request.zone})' if self.request.zone else ''}"


def alternatives(request: ClusterRequest, catalog: Catalog | None = None) -> list[Alternative]:
    """Where ``request`` may go next, in order: the other zones of its region that offer the
    type, then the same instance type in the other regions that list a price for the market
    in force (cheapest first, then by name). Empty for a request without an offer (Local)."""
    offer = request.offer
    if offer is None or offer.provider == "local":
        return []
    found: list[Alternative] = []
    provider = request.spec.provider
    current_zone = request.zone or (offer.zones[0] if offer.zones else None)
    if not getattr(provider, "zone", None):  # a zone the user pinned stays
        found += [Alternative(replace(request, zone=zone), f"next zone of {offer.region}")
                  for zone in offer.zones if zone != current_zone]
    if request.spec.region or getattr(provider, "region", None):
        return found  # so does a pinned region
    regions = sorted(
        (o for o in (catalog or current_catalog(offer.provider)).offers
         if o.instance_type == offer.instance_type and o.region != offer.region
         and _priced(o, request)),
        key=lambda o: (_listed_price(o, request), o.region),
    )
    for other in regions:
        found.append(Alternative(replace(request, offer=other, zone=None),
                                 f"next region offering {offer.instance_type}"))
    return found


def spec_alternatives(request: ClusterRequest, fallbacks: Sequence[Choice]) -> list[Alternative]:
    """The other Specs of a multi-spec ``Compute``, each at its best offer, as places to try
    after ``request``'s own zones and regions (the same stack, now declaring that Spec)."""
    return [Alternative(replace(request, spec=choice.spec, offer=choice.offer, zone=None,
                                market=None, on_demand_nodes=frozenset()),
                        f"next Spec ({choice.spec.provider.kind} {choice.offer.instance_type})")
            for choice in fallbacks]


T = TypeVar("T")


def up_with_failover(up: Callable[[ClusterRequest], T], request: ClusterRequest,
                     places: list[Alternative], limit: int,
                     on_move: Callable[[ClusterRequest, Alternative, int, str], None],
                     ) -> tuple[T, ClusterRequest]:
    """``up(request)``; while it fails with capacity refused, ``on_move(next request, where,
    attempt, reason)`` and ``up`` there, trying at most ``limit`` places in all. Returns what
    the last ``up`` returned and the request it ran."""
    attempt, remaining = 1, list(places)
    while True:
        try:
            return up(request), request
        except ProvisionError as exc:
            if not remaining or attempt >= limit or not capacity_refused(str(exc)):
                raise
            reason = next((line.strip() for line in str(exc).splitlines()
                           if capacity_refused(line)), str(exc).strip())[:300]
        attempt += 1
        place = remaining.pop(0)
        # Nodes the spot fallback moved on demand stay so in the same Spec, not in another.
        same_spec = place.request.spec is request.spec
        request = replace(place.request, node_count=request.node_count,
                          on_demand_nodes=request.on_demand_nodes if same_spec else frozenset())
        on_move(request, place, attempt, reason)


def _priced(offer: Offer, request: ClusterRequest) -> bool:
    return _listed_price(offer, request) != float("inf")


def _listed_price(offer: Offer, request: ClusterRequest) -> float:
    """The offer's price on the request's market; on-demand (a listed price) decides between
    regions when the spot figures are estimates."""
    from skyward_iac.infra.capacity.spot_fallback import request_market

    market = request_market(request) or "on-demand"
    price = offer.price(market)
    if price is None:
        return float("inf")
    if market == "spot" and offer.spot_estimated:
        return offer.on_demand if offer.on_demand is not None else price
    return price
