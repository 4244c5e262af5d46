"""Node fallback: nodes the cloud refused are declared again where they may launch.

When ``pulumi up`` fails because the cloud refused some nodes (``refusals.py`` reads the
cloud's error code), each refused node moves, and ``up`` runs again; nodes that launched stay
as they are, and the stack's history records every update. A node moves, in this order:

1. to a sibling zone of its region, on the same market, when the refusal is its zone's (no
   capacity there, a spot price over the cap there, the type not offered there) and the node
   may move alone (``zones.nodes_move_alone``: an AWS pool without a placement group); each
   zone is tried once per market;
2. on demand, under ``allocation="spot-if-available"`` (and ``"cheapest"`` when spot was the
   cheaper market), when an on-demand launch may succeed where spot was refused (the zone's
   capacity or price, or the region's spot limit ``MaxSpotInstanceCountExceeded``); then on to
   the sibling zones again, on demand.

A pool whose nodes move only together (a placement group; any GCP pool) and none of whose
nodes exists yet leaves a zone's refusal to capacity failover when it tries a sibling zone next
(``defer_zonal``): the whole pool tries the next zone before any node goes on demand.
``allocation="spot"`` never falls back on demand. A refusal of the whole region on the market in
force, or of every region (a quota), is left to failover (``failover.py``). The decision is pure
(``node_retry``); ``up_with_spot_fallback`` runs it, each retry one attempt of the sequence
capacity failover spends too (``api/retry.Attempts``, bounded by
``Options(max_provision_attempts)``), announced to ``on_retry`` (a ``ProvisionRetried``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from skyward_iac.api.errors import ProvisionError
from skyward_iac.api.retry import Attempts
from skyward_iac.infra.capacity.offers import Market, market_for
from skyward_iac.infra.capacity.refusals import Cause, Refusal, Scope, refusal_in
from skyward_iac.infra.capacity.zones import node_zone, nodes_move_alone, ordered, pool_zone
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.outputs import ClusterOutputs

log = logging.getLogger("skyward")

#: Allocations that accept on-demand nodes when spot capacity is refused.
FALLBACK_ALLOCATIONS = ("spot-if-available", "cheapest")
_NODE_URN = re.compile(r"::node-(\d+)$")
#: A node's attempts: (zone, market) pairs it was refused in.
Attempt = tuple[str | None, Market | None]


def request_market(request: ClusterRequest) -> Market | None:
    """The market the request's nodes start on (forced, else from its allocation and offer)."""
    if request.market is not None:
        return request.market
    return market_for(request.spec.allocation, request.offer) if request.offer else None


def node_market(request: ClusterRequest, node: int) -> Market | None:
    """The market ``request`` declares node ``node`` on."""
    return "on-demand" if node in request.on_demand_nodes else request_market(request)


def on_demand_helps(request: ClusterRequest, refusal: Refusal, market: Market | None) -> bool:
    """Whether a spot node refused so may launch on demand, and the pool accepts that."""
    if market != "spot" or request.spec.allocation not in FALLBACK_ALLOCATIONS:
        return False
    if request.offer is None or request.offer.on_demand is None:
        return False
    zonal = refusal.scope is Scope.ZONE and refusal.cause in (Cause.CAPACITY, Cause.PRICE)
    return zonal or (refusal.spot_only and refusal.scope is Scope.REGION)


def next_zone(request: ClusterRequest, refusal: Refusal, market: Market | None,
              attempts: Iterable[Attempt]) -> str | None:
    """The sibling zone a node refused by ``refusal`` tries next on ``market``: the first of
    the offer's zones (the pool's first) it was not refused in on that market, or None."""
    if refusal.scope is not Scope.ZONE or request.offer is None:
        return None
    refused = {zone for zone, on in attempts if on == market}
    return next((zone for zone in ordered(request.offer.zones, pool_zone(request))
                 if zone not in refused), None)


def node_retry(request: ClusterRequest, failures: Mapping[int, str],
               attempts: Mapping[int, Iterable[Attempt]] | None = None,
               defer_zonal: bool = False) -> ClusterRequest | None:
    """The request for another ``up`` after ``failures`` (node index -> error text), each
    refused node moved as the module doc says; None when no refused node can go anywhere else
    here (the caller raises, and capacity failover decides). ``attempts``: per node, the
    (zone, market) pairs it was already refused in."""
    zones = dict(request.node_zones)
    on_demand = set(request.on_demand_nodes)
    alone = nodes_move_alone(request)
    for node, message in sorted(failures.items()):
        refusal = refusal_in(message)
        if refusal is None:
            continue
        market = node_market(request, node)
        here = refusal.zone or node_zone(request, node)
        tried = {*(attempts or {}).get(node, ()), (here, market)}
        moved = next_zone(request, refusal, market, tried) if alone else None
        if moved is not None:
            zones[node] = moved
        elif defer_zonal and not alone and refusal.scope is Scope.ZONE:
            return None  # the whole pool tries the next zone first (capacity failover)
        elif on_demand_helps(request, refusal, market):
            on_demand.add(node)
    if zones == dict(request.node_zones) and on_demand == set(request.on_demand_nodes):
        return None
    return replace(request, node_zones=zones, on_demand_nodes=frozenset(on_demand))


class NodeFailures:
    """An engine ``on_event`` that records each ``node-<i>`` resource's error diagnostics and
    passes every event on to ``forward``."""

    def __init__(self, forward: Callable[[Any], Any] | None = None) -> None:
        self.forward = forward
        #: Node index -> its error text(s), newline-joined.
        self.by_node: dict[int, str] = {}

    def __call__(self, event: Any) -> None:
        diagnostic = getattr(event, "diagnostic_event", None)
        errored = diagnostic is not None and str(getattr(diagnostic, "severity", "")) == "error"
        if errored and (match := _NODE_URN.search(getattr(diagnostic, "urn", None) or "")):
            node = int(match.group(1))
            text = str(getattr(diagnostic, "message", ""))
            self.by_node[node] = f"{self.by_node[node]}\n{text}" if node in self.by_node else text
        if self.forward is not None:
            self.forward(event)


def describe_moves(before: ClusterRequest, after: ClusterRequest) -> str:
    """``node 2 -> us-east-1b; node 0 -> on demand``: what a retry changed."""
    moves = [f"node {node} -> {zone}" for node, zone in sorted(after.node_zones.items())
             if before.node_zones.get(node) != zone]
    moves += [f"node {node} -> on demand"
              for node in sorted(after.on_demand_nodes - before.on_demand_nodes)]
    return "; ".join(moves)


def up_with_spot_fallback(
    stack: ClusterStack, request: ClusterRequest,
    on_event: Callable[[Any], Any] | None = None, defer_zonal: bool = False,
    attempts: Attempts | None = None,
    on_retry: Callable[[ClusterRequest, int, str, str], Any] | None = None, **up_options: Any,
) -> tuple[ClusterOutputs, ClusterRequest]:
    """``stack.up(**up_options)``; while it fails with nodes refused that may launch elsewhere
    (``node_retry``), move them and run ``up`` again, each time spending one of ``attempts``
    (none left: the refusal is raised, for failover to judge) and calling
    ``on_retry(request, attempt, reason, what moved)`` first. Returns the outputs and the
    request in force. Used for the first ``up`` and for every later one (replacements,
    resizes). Without ``attempts``, each node tries each zone once per market."""
    tried: dict[int, set[Attempt]] = {}
    while True:
        failures = NodeFailures(on_event)
        try:
            return stack.up(on_event=failures, **up_options), request
        except ProvisionError:
            for node, message in failures.by_node.items():
                refusal = refusal_in(message)
                zone = (refusal.zone if refusal else None) or node_zone(request, node)
                tried.setdefault(node, set()).add((zone, node_market(request, node)))
            retry = node_retry(request, failures.by_node, tried, defer_zonal)
            attempt = None if retry is None or attempts is None else attempts.spend()
            if retry is None or (attempts is not None and attempt is None):
                raise
        first = next(iter(failures.by_node.values()), "").strip().splitlines()
        reason = _reason(failures.by_node)
        moves = describe_moves(request, retry)
        log.warning("stack %s: the cloud refused node(s) %s (%s); retrying: %s",
                    request.stack_name, ", ".join(map(str, sorted(failures.by_node))),
                    first[0][:200] if first else "", moves)
        stack.set_request(retry)
        if on_retry is not None and attempt is not None:
            on_retry(retry, attempt, reason, moves)
        request = retry


def _reason(by_node: Mapping[int, str]) -> str:
    """The first refusal among the nodes' errors, as failover words one (for the event)."""
    for message in by_node.values():
        if (refusal := refusal_in(message)) is not None:
            return f"{refusal.describe()}: {refusal.line}"[:300]
    return ""
