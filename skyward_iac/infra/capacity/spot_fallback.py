"""Spot capacity fallback: nodes whose spot launch the cloud refused are retried on demand.

Under ``allocation="spot-if-available"`` (and ``"cheapest"`` when spot was the cheaper market)
a pool starts on spot. When ``pulumi up`` fails because the cloud has no spot capacity (AWS
``InsufficientInstanceCapacity`` or ``MaxSpotInstanceCountExceeded``, GCP
``ZONE_RESOURCE_POOL_EXHAUSTED`` ...), the nodes named in those errors are declared on demand
(``ClusterRequest.on_demand_nodes``) and ``up`` runs again: nodes that did get spot capacity
stay on spot, and the stack's history records both updates. ``allocation="spot"`` never falls
back. The decision (error text -> which nodes move) is pure; ``up_with_spot_fallback`` runs it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from skyward_iac.api.errors import ProvisionError
from skyward_iac.infra.capacity.offers import Market, market_for
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.outputs import ClusterOutputs

log = logging.getLogger("skyward")

#: Error texts meaning "no spot capacity now" (not a bad request, quota or price cap).
SPOT_CAPACITY_ERRORS = (
    "InsufficientInstanceCapacity",  # AWS: no capacity of the type in the zone
    "MaxSpotInstanceCountExceeded",  # AWS: the account's spot request limit
    "Max spot instance count exceeded",
    "capacity-not-available",  # AWS spot request status
    "There is no Spot capacity available",
    "ZONE_RESOURCE_POOL_EXHAUSTED",  # GCP (also ..._WITH_DETAILS)
    "does not have enough resources available to fulfill the request",  # GCP's message for it
)
#: Allocations that accept on-demand nodes when spot capacity is refused.
FALLBACK_ALLOCATIONS = ("spot-if-available", "cheapest")
_NODE_URN = re.compile(r"::node-(\d+)$")


def spot_capacity_refused(message: str) -> bool:
    """Whether an engine error says the cloud has no spot capacity for the request."""
    return any(marker.lower() in message.lower() for marker in SPOT_CAPACITY_ERRORS)


def request_market(request: ClusterRequest) -> Market | None:
    """The market the request's nodes start on (forced, else from its allocation and offer)."""
    if request.market is not None:
        return request.market
    return market_for(request.spec.allocation, request.offer) if request.offer else None


def on_demand_retry(request: ClusterRequest, failures: Mapping[int, str]) -> ClusterRequest | None:
    """The request for a second ``up`` after ``failures`` (node index -> error text), or None
    when there is nothing to fall back: not a spot pool, an allocation that insists on spot,
    no on-demand market, or no node refused for spot capacity."""
    if request.spec.allocation not in FALLBACK_ALLOCATIONS or request_market(request) != "spot":
        return None
    if request.offer is None or request.offer.on_demand is None:
        return None
    refused = {node for node, message in failures.items()
               if spot_capacity_refused(message) and node not in request.on_demand_nodes}
    if not refused:
        return None
    return replace(request, on_demand_nodes=request.on_demand_nodes | refused)


class NodeFailures:
    """An engine ``on_event`` that records each ``node-<i>`` resource's error diagnostics and
    passes every event on to ``forward``."""

    def __init__(self, forward: Callable[[Any], Any] | None = None) -> None:
        self.forward = forward
        #: Node index -> its error text(s), newline-joined.
        self.by_node: dict[int, str] = {}

    def __call__(self, event: Any) -> None:
        diagnostic = getattr(event, "diagnostic_event", None)
        if diagnostic is not None and str(getattr(diagnostic, "severity", "")) == "error":
            if match := _NODE_URN.search(getattr(diagnostic, "urn", None) or ""):
                node = int(match.group(1))
                text = str(getattr(diagnostic, "message", ""))
                self.by_node[node] = f"{self.by_node[node]}\n{text}" if node in self.by_node \
                    else text
        if self.forward is not None:
            self.forward(event)


def up_with_spot_fallback(
    stack: ClusterStack, request: ClusterRequest,
    on_event: Callable[[Any], Any] | None = None, **up_options: Any,
) -> tuple[ClusterOutputs, ClusterRequest]:
    """``stack.up(**up_options)``; while it fails with spot capacity refused for some nodes,
    move those nodes on demand and run ``up`` again. Returns the outputs and the request in
    force. Used for the first ``up`` and for every later one (replacements, resizes)."""
    while True:
        failures = NodeFailures(on_event)
        try:
            return stack.up(on_event=failures, **up_options), request
        except ProvisionError:
            retry = on_demand_retry(request, failures.by_node)
            if retry is None:
                raise
        moved = sorted(retry.on_demand_nodes - request.on_demand_nodes)
        log.warning("stack %s: no spot capacity for node(s) %s (%s); retrying them on demand",
                    request.stack_name, ", ".join(map(str, moved)),
                    failures.by_node[moved[0]].strip().splitlines()[0][:200])
        stack.set_request(retry)
        request = retry
