"""What a cloud stack decides once, and every later update declares again.

A running node's replace-forcing inputs (``replacement.py``) must never change, yet several of
them follow things that move: the newest image of a family, the zones the cloud offers a type
in, and the request of whichever process runs the update (its creation time and tags, its
lifetime cap, the pool's maximum that decides placement, the place capacity failover chose).
So a stack's first run decides each of them and records it (``Recorder``); ``ClusterStack``
stores the record in the stack's config once the run succeeded (``skyward:<key>``, beside the
account pins of ``pins.py``); every later run -- a resize, a spot fallback, a warm adopter's
update, the apply of a reviewed plan -- declares what is stored, whoever runs it:

* ``tags``, ``maxLifetime``, ``maxNodes``: the creating request's, always;
* ``place`` (provider, region, instance type): the stored one once the stack has nodes
  (``nodes`` is stored only after a successful update), so capacity failover can still move a
  pool none of whose nodes exists, and nothing can move one that runs;
* ``zone`` and ``image``, for new nodes: stored with their place;
* ``nodes``: the image (and GCP zone) each node was created with, kept for its life.

A newer image reaches a pool only as a new pool, or when someone rewrites ``skyward:image`` on
purpose (an explicit refresh): nodes created after it get the new image, running ones keep
theirs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pulumi

from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.capacity.offers import Offer, current_catalog, select
from skyward_iac.infra.programs import ClusterRequest, common, pins
from skyward_iac.infra.programs.common import ClusterPlan


@dataclass(frozen=True, slots=True)
class NodePin:
    """What one node was created with."""

    image: str
    zone: str | None = None


@dataclass(frozen=True, slots=True)
class Decided:
    """The values one run declares: the stored ones, and this run's choice for the rest
    (``zone`` and ``image`` None: the program looks them up and records what it found)."""

    offer: Offer
    tags: Mapping[str, str]
    max_lifetime: int | None
    max_nodes: int
    zone: str | None
    image: str | None
    nodes: Mapping[int, NodePin]

    def request(self, request: ClusterRequest) -> ClusterRequest:
        """``request`` as the stack decided it."""
        return replace(request, offer=self.offer, max_lifetime=self.max_lifetime,
                       max_nodes=self.max_nodes)

    def plan(self, request: ClusterRequest) -> ClusterPlan:
        """The cluster plan for ``request`` with the stack's decisions."""
        return replace(common.plan_cluster(self.request(request)), tags=dict(self.tags))


def place_of(offer: Offer) -> str:
    """``provider:region:instance type``: where a pool's nodes run."""
    return f"{offer.provider}:{offer.region}:{offer.instance_type}"


def decide(request: ClusterRequest, stored: Mapping[str, str]) -> Decided:
    """What a run of ``request``'s program declares, given the stack's stored decisions.
    ``ConfigError`` for a stored value that cannot be read, or a place the catalog lost."""
    nodes = _nodes(stored)
    offer = request.offer or select([request.spec]).offer
    if nodes and stored.get(pins.PLACE) and stored[pins.PLACE] != place_of(offer):
        offer = _offer_at(stored[pins.PLACE], request)  # the nodes run there, not elsewhere
    same_place = stored.get(pins.PLACE) == place_of(offer)
    zone = stored.get(pins.ZONE) if nodes else request.zone or (
        stored.get(pins.ZONE) if same_place else None)
    lifetime = stored.get(pins.MAX_LIFETIME)
    return Decided(
        offer=offer,
        # Sorted as stored: the provider's default tags are one JSON text, order included.
        tags=dict(sorted((_json_map(stored, pins.TAGS) if pins.TAGS in stored
                          else common.resource_tags(request)).items())),
        max_lifetime=(_number(stored, pins.MAX_LIFETIME) or None) if lifetime is not None
        else request.max_lifetime,
        max_nodes=_number(stored, pins.MAX_NODES) if pins.MAX_NODES in stored
        else request.max_nodes or request.node_count,
        zone=zone or None,
        image=stored.get(pins.IMAGE) if same_place else None,
        nodes=nodes,
    )


def _offer_at(place: str, request: ClusterRequest) -> Offer:
    provider, region, instance_type = (place.split(":", 2) + ["", ""])[:3]
    if provider != request.spec.provider.kind:
        raise ConfigError(f"stack {request.stack_name} runs {provider} nodes ({place}); a "
                          f"{request.spec.provider.kind} request cannot update it")
    for offer in current_catalog(provider).offers:
        if offer.region == region and offer.instance_type == instance_type:
            return offer
    raise ConfigError(f"stack {request.stack_name} runs {instance_type} in {region}, which the "
                      f"{provider} catalog no longer lists; its nodes cannot be declared again")


def _nodes(stored: Mapping[str, str]) -> dict[int, NodePin]:
    if not stored.get(pins.NODES):
        return {}
    try:
        return {int(index): NodePin(str(pin["image"]), pin.get("zone"))
                for index, pin in json.loads(stored[pins.NODES]).items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ConfigError(f"skyward:{pins.NODES} must map node indexes to "
                          f'{{"image": ..., "zone": ...}}, got {stored[pins.NODES]!r}') from None


def _json_map(stored: Mapping[str, str], key: str) -> dict[str, str]:
    try:
        value = json.loads(stored[key])
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ConfigError(f"skyward:{key} must be a JSON object, got {stored[key]!r}")
    return {str(k): str(v) for k, v in value.items()}


def _number(stored: Mapping[str, str], key: str) -> int:
    try:
        return int(stored[key])
    except ValueError:
        raise ConfigError(f"skyward:{key} must be a whole number, got {stored[key]!r}") from None


def canonical(value: Any) -> str:
    """``value`` as stored: compact JSON with sorted keys, so equal values store equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Recorder:
    """What one run decided, as config values (``record`` accepts Outputs: a looked-up image is
    recorded once the lookup answered)."""

    def __init__(self, stored: Mapping[str, str]) -> None:
        self.stored = dict(stored)
        self.values: dict[str, str] = {}

    def record(self, key: str, value: pulumi.Input[str]) -> None:
        pulumi.Output.from_input(value).apply(lambda text: self.values.__setitem__(key, text))

    def identity(self, decided: Decided) -> None:
        """Record the place, tags, lifetime cap and pool maximum of ``decided``."""
        self.record(pins.PLACE, place_of(decided.offer))
        self.record(pins.TAGS, canonical(dict(decided.tags)))
        self.record(pins.MAX_LIFETIME, str(decided.max_lifetime or 0))
        self.record(pins.MAX_NODES, str(decided.max_nodes))

    def nodes(self, images: Mapping[int, pulumi.Input[str]],
              zones: Mapping[int, str] | None = None) -> None:
        """Record each declared node's image (and zone)."""
        ordered = sorted(images)

        def table(resolved: list[str]) -> str:
            return canonical({str(i): {"image": image, **({"zone": zones[i]} if zones else {})}
                              for i, image in zip(ordered, resolved, strict=True)})

        self.record(pins.NODES, pulumi.Output.all(*(images[i] for i in ordered)).apply(table))

    def unstored(self) -> dict[str, str]:
        """The recorded values the stack's config does not hold yet."""
        return {k: v for k, v in self.values.items() if self.stored.get(k) != v}


@dataclass(frozen=True, slots=True)
class Fallback:
    """What a program goes without after the cloud refused part of an update: the config
    values that say so (stored before the update runs again) and the warning to give."""

    values: Mapping[str, str]
    warning: str


class StackProgram:
    """A cloud stack's inline program: each run reads the stack's pins, declares the cluster
    through ``declare`` (which records its decisions) and exports what it returns.
    ``unstored()`` is what the last run decided that the stack does not store yet; ClusterStack
    stores it once that run succeeded. ``fallback`` maps a failed update's errors (logical
    resource name -> text) to what the program can go without (``stacks/fallbacks.py``)."""

    def __init__(self, provider: str,
                 declare: Callable[[Mapping[str, str], Recorder], Mapping[str, Any]],
                 fallback: Callable[[Mapping[str, str]], Fallback | None] | None = None,
                 ) -> None:
        self.provider = provider
        self.declare = declare
        self.fallback = fallback
        self.recorder: Recorder | None = None

    def __call__(self) -> None:
        stored = pins.read_pins(self.provider)
        self.recorder = Recorder(stored)
        common.export_cluster(self.declare(stored, self.recorder))

    def unstored(self) -> dict[str, str]:
        return self.recorder.unstored() if self.recorder is not None else {}
