"""Which zones of its region a pool's nodes may use, and where a refused node goes next.

The zones come from the catalog row (``Offer.zones``: where the cloud offers the type, from
dated offerings data). A pool's nodes may each run in their own zone when nothing holds them
together: on AWS a pool without a placement group (a cluster placement group, and with it an
EFA pool, lives in one zone); on GCP a pool without a compact placement policy (its subnetwork
spans the region) and without a zone the user set. Pure functions over the request and the
catalog.
"""

from __future__ import annotations

from collections.abc import Mapping

from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.capacity.offers import Offer, current_catalog, packaged_catalog
from skyward_iac.infra.clouds import cloud
from skyward_iac.infra.programs import ClusterRequest


def usable_zones(offer: Offer) -> tuple[str, ...]:
    """The zones of ``offer.region`` that offer its type: the row's own, else those of the
    shipped catalog's row (a catalog refreshed before rows carried zones lists none).
    ``ConfigError`` naming the type, the region and the regions that do offer it when neither
    lists a zone."""
    if offer.zones:
        return offer.zones
    shipped = next((o.zones for o in packaged_catalog(offer.provider).offers
                    if o.instance_type == offer.instance_type and o.region == offer.region), ())
    if shipped:
        return shipped
    raise unoffered(offer)


def unoffered(offer: Offer) -> ConfigError:
    """The error for a type no zone of its region offers: which regions do."""
    elsewhere = sorted({o.region for provider_catalog in (current_catalog(offer.provider),
                                                          packaged_catalog(offer.provider))
                        for o in provider_catalog.offers
                        if o.instance_type == offer.instance_type and o.zones
                        and o.region != offer.region})
    where = (f"regions that offer it: {', '.join(elsewhere)}" if elsewhere
             else "no region of the catalog offers it")
    return ConfigError(f"{offer.instance_type} is not offered in any zone of {offer.region} "
                       f"({offer.provider} catalog); {where}")


def ordered(zones: tuple[str, ...], first: str | None) -> tuple[str, ...]:
    """``zones`` starting at ``first`` (the pool's zone), the others in catalog order."""
    if first is None:
        return zones
    return (first, *(zone for zone in zones if zone != first))


def pool_zone(request: ClusterRequest) -> str | None:
    """Where the pool's nodes go unless moved: the zone failover chose, else the first zone
    offering the type (None without a catalog zone: the program decides)."""
    if request.zone:
        return request.zone
    offer = request.offer
    return offer.zones[0] if offer is not None and offer.zones else None


def nodes_move_alone(request: ClusterRequest) -> bool:
    """Whether a node refused in its zone may be declared in a sibling zone while the others
    stay: in a region with more than one zone, when its cloud says so (``Cloud.nodes_move_alone``:
    an AWS pool without a placement group; a GCP pool without a compact placement policy and
    without a zone the user set)."""
    offer = request.offer
    if offer is None or len(offer.zones) < 2:
        return False
    return cloud(request.spec.provider.kind).nodes_move_alone(request)


def declared_zones(node_count: int, pool_zone: str, pinned: Mapping[int, str | None],
                   moved: Mapping[int, str], together: bool) -> dict[int, str]:
    """The zone of every node a program declares: the one it was created in (``pinned``;
    nodes pinned before zones were stored run in the pool's zone), else the zone a capacity
    refusal moved it to (``moved``; never for a pool held ``together`` in one zone), else the
    pool's zone."""
    zones = {}
    for index in range(node_count):
        if index in pinned:
            zones[index] = pinned[index] or pool_zone
        elif not together and index in moved:
            zones[index] = moved[index]
        else:
            zones[index] = pool_zone
    return zones


def node_zone(request: ClusterRequest, node: int) -> str | None:
    """The zone ``request`` declares node ``node`` in (before the stack's own pins)."""
    return request.node_zones.get(node) or pool_zone(request)
