"""Capacity failover: where a new pool goes when the cloud refuses it where it asked.

When the first ``up`` of a pool fails because the cloud refused its nodes and the node fallback
(``spot_fallback.py``: sibling zones for nodes that move alone, then on demand) found nowhere
else for them, the pool tries, in order: the next zone of the region offering the type (pools
whose nodes move only together: a placement group, any GCP pool), then the next region offering
the same instance type (cheapest listed price first), then the next Spec of a multi-spec
``Compute`` (in the order ``Options.selection`` ranks them), each as one more stack update with
a ``sky.ProvisionRetried`` event saying why. The refusal's scope (``refusals.py``) spends the
attempts: a zone's refusal tries the next place, a region's skips the other zones of that
region, a refusal of every region (a global quota such as GCP's ``GPUS_ALL_REGIONS``) skips
every place on that cloud; when nothing that could help is left, the error names the refusal
and, for a quota, how to raise it. Only a pool none of whose nodes exists moves: moving a stack
with running nodes would replace them. The order is a pure function of the request and the
catalog; the reconciler runs it. Every place tried, and every node the node fallback moves,
is one attempt of one sequence (``api/retry.Attempts``) bounded by
``Options(max_provision_attempts)`` and announced by a ``ProvisionRetried``
(``api/retry.for_provision``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from skyward_iac.api.errors import ProvisionError
from skyward_iac.api.retry import Attempts
from skyward_iac.infra.capacity.offers import Catalog, Choice, Offer, current_catalog
from skyward_iac.infra.capacity.refusals import Refusal, Scope, refusal_in
from skyward_iac.infra.capacity.zones import nodes_move_alone
from skyward_iac.infra.clouds import cloud
from skyward_iac.infra.programs import ClusterRequest


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
    type (unless its nodes move alone: the node fallback tries those zones node by node), then
    the same instance type in the other regions that list a price for the market in force
    (cheapest first, then by name). Empty for a request without an offer (Local)."""
    offer = request.offer
    if offer is None or cloud(offer.provider).on_this_machine:
        return []
    found: list[Alternative] = []
    provider = request.spec.provider
    current_zone = request.zone or (offer.zones[0] if offer.zones else None)
    # A zone the user pinned stays.
    if not getattr(provider, "zone", None) and not nodes_move_alone(request):
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
        found.append(Alternative(replace(request, offer=other, zone=None, node_zones={}),
                                 f"next region offering {offer.instance_type}"))
    return found


def spec_alternatives(request: ClusterRequest, fallbacks: Sequence[Choice]) -> list[Alternative]:
    """The other Specs of a multi-spec ``Compute``, each at its best offer, as places to try
    after ``request``'s own zones and regions (the same stack, now declaring that Spec)."""
    return [Alternative(replace(request, spec=choice.spec, offer=choice.offer, zone=None,
                                market=None, on_demand_nodes=frozenset(), node_zones={}),
                        f"next Spec ({choice.spec.provider.kind} {choice.offer.instance_type})")
            for choice in fallbacks]


def can_help(place: Alternative, refused: ClusterRequest, refusal: Refusal) -> bool:
    """Whether ``place`` lies beyond what ``refusal`` (of ``refused``) reaches: any place for a
    zone's refusal, another region or cloud for a region's, another cloud for a global one."""
    here, there = refused.offer, place.request.offer
    if refusal.scope is Scope.ZONE or here is None or there is None:
        return True
    if there.provider != here.provider:
        return True
    return refusal.scope is Scope.REGION and there.region != here.region


def refused_error(refusal: Refusal, cause: ProvisionError, tried: int,
                  limited: bool = False, offer: Offer | None = None) -> ProvisionError:
    """The error for the refusal that ended failover: what the cloud said, how far it reaches,
    why no other place was tried and, for a quota, how to raise it (the engine's own message
    follows)."""
    lead = f"{refusal.provider.upper()} refused the pool: {refusal.describe()}"
    if limited:
        why = (f"{tried} place(s) tried, the most Options(max_provision_attempts) allows")
    elif refusal.scope is Scope.GLOBAL:
        why = "that quota counts every region, so no other region or zone can help"
    elif refusal.scope is Scope.REGION:
        why = "no other region or Spec is left to try (the refusal covers every zone here)"
    else:
        why = "no other zone, region or Spec is left to try"
    advice = refusal.how_to_raise(offer.instance_type if offer else None,
                                  offer.region if offer else None)
    return ProvisionError(f"{lead}; {why}{f'. To {advice}' if advice else ''}\n{cause}")


T = TypeVar("T")


def up_with_failover(up: Callable[[ClusterRequest, bool], T], request: ClusterRequest,
                     places: list[Alternative], limit: int | Attempts,
                     on_move: Callable[[ClusterRequest, Alternative, int, str], None],
                     ) -> tuple[T, ClusterRequest]:
    """``up(request, zone_next)``; while it fails with a refusal some place left may not share,
    ``on_move(next request, where, attempt, reason)`` and ``up`` there, making at most
    ``limit`` attempts in all (an ``Attempts`` the node fallback inside ``up`` spends too).
    ``zone_next`` tells ``up`` that a sibling zone is tried next (the node fallback leaves a
    zone's refusal to it). Returns what the last ``up`` returned and the request it ran."""
    attempts = limit if isinstance(limit, Attempts) else Attempts(limit)
    remaining = list(places)
    while True:
        zone_next = (not attempts.exhausted() and bool(remaining)
                     and _same_region(remaining[0].request, request))
        try:
            return up(request, zone_next), request
        except ProvisionError as exc:
            refusal = refusal_in(str(exc))
            if refusal is None:
                raise
            remaining = [place for place in remaining if can_help(place, request, refusal)]
            attempt = attempts.spend() if remaining else None
            if attempt is None:
                raise refused_error(refusal, exc, attempts.made, attempts.cut_short,
                                    request.offer) from exc
            reason = f"{refusal.describe()}: {refusal.line}"[:300]
        place = remaining.pop(0)
        # Nodes the fallback moved on demand stay so in the same Spec, not in another.
        same_spec = place.request.spec is request.spec
        request = replace(place.request, node_count=request.node_count,
                          on_demand_nodes=request.on_demand_nodes if same_spec else frozenset())
        on_move(request, place, attempt, reason)


def _same_region(place: ClusterRequest, request: ClusterRequest) -> bool:
    return (place.offer is not None and request.offer is not None
            and place.offer.provider == request.offer.provider
            and place.offer.region == request.offer.region)


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
