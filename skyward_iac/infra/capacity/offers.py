"""Offers: which instance type, region and market serve a ``Spec``, and what it costs.

The catalog ships with the package (``infra/catalog/<provider>.json``, dated by its ``as_of``):
instance type -> accelerator type/count/memory, vCPUs, RAM, architecture and per-region
on-demand and spot USD/hour. ``skyward-iac offers refresh`` writes a catalog rebuilt from the
live pricing APIs to ``$SKYWARD_HOME/catalog/<provider>.json``; ``current_catalog()`` uses whichever
of the two is newer. Selection is pure over that data, so a request nothing matches fails
before anything is provisioned, naming the constraint that emptied the list.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.options import SelectionStrategy
from skyward_iac.api.providers import Local
from skyward_iac.api.spec import AllocationStrategy, Spec
from skyward_iac.infra.capacity.constraints import (
    Constraint,
    accelerator_constraints,
    offered,
    shape_constraints,
)
from skyward_iac.infra.capacity.local_fit import check_local_fits
from skyward_iac.infra.stacks import home

Market = Literal["spot", "on-demand"]
CLOUDS = ("aws", "gcp")
#: ``Catalog.origin`` of the catalog shipped with the package.
SHIPPED = "shipped"


@dataclass(frozen=True, slots=True)
class Offer:
    """One instance type in one region, with its hardware and hourly prices (USD per node)."""

    provider: str
    instance_type: str
    region: str
    vcpus: float
    memory_gb: float
    architecture: str
    on_demand: float | None
    spot: float | None
    accelerator: str | None = None
    accelerator_count: float = 0
    accelerator_memory_gb: float | None = None
    accelerator_form_factor: str | None = None
    machine_type: str = ""  # what the cloud API takes; GCP N1 rows add guest GPUs to it
    zones: tuple[str, ...] = ()
    guest_accelerator: tuple[str, int] | None = None  # GCP: (accelerator type, count) to attach
    boot_disk_type: str | None = None
    #: The spot price is an estimate (the shipped catalog's typical figure), not a quote.
    spot_estimated: bool = False

    def price(self, market: Market) -> float | None:
        """USD per node-hour on ``market``, None when that market is not offered."""
        return self.spot if market == "spot" else self.on_demand


@dataclass(frozen=True, slots=True)
class Catalog:
    """Every offer of one provider, with the date and origin of its figures."""

    provider: str
    as_of: str
    source: str
    offers: tuple[Offer, ...]
    #: ``SHIPPED`` for the packaged catalog, else the path of the refreshed file.
    origin: str = SHIPPED

    @classmethod
    def from_dict(cls, data: dict[str, Any], origin: str = SHIPPED) -> Catalog:
        """Parse the JSON catalog format (see ``infra/catalog/aws.json``)."""
        provider = data["provider"]
        # Shipped spot figures are typical values, not quotes (the catalog's source says how
        # they were derived); a refreshed catalog says for itself.
        estimated = bool(data.get("spot_estimated", origin == SHIPPED))
        offers = tuple(
            _offer(provider, row, region, prices, estimated)
            for row in data["instances"] for region, prices in row["regions"].items()
        )
        return cls(provider, data["as_of"], data["source"], offers, origin)

    @classmethod
    def from_file(cls, path: Path) -> Catalog:
        """A catalog from a JSON file (for example a refreshed copy)."""
        return cls.from_dict(json.loads(path.read_text()), origin=str(path))

    @property
    def refreshed(self) -> bool:
        """True when the figures come from ``skyward-iac offers refresh``, not the package."""
        return self.origin != SHIPPED

    def describe(self) -> str:
        """Where the figures come from, e.g. ``aws 2025-06 (shipped)``."""
        where = f"refreshed, {self.origin}" if self.refreshed else SHIPPED
        return f"{self.provider} {self.as_of} ({where})"


def _offer(provider: str, row: dict[str, Any], region: str, prices: dict[str, Any],
           spot_estimated: bool = False) -> Offer:
    accel = row.get("accelerator") or {}
    guest = row.get("guest_accelerator")
    return Offer(
        provider=provider, instance_type=row["instance_type"], region=region,
        vcpus=float(row["vcpus"]), memory_gb=float(row["memory_gb"]),
        architecture=row["architecture"], on_demand=prices.get("on_demand"),
        spot=prices.get("spot"), accelerator=accel.get("name"),
        accelerator_count=float(accel.get("count", 0)),
        accelerator_memory_gb=accel.get("memory_gb"),
        accelerator_form_factor=accel.get("form_factor"),
        machine_type=row.get("machine_type", row["instance_type"]),
        zones=tuple(prices.get("zones", ())),
        guest_accelerator=(guest["type"], int(guest["count"])) if guest else None,
        boot_disk_type=row.get("boot_disk_type"),
        spot_estimated=spot_estimated and prices.get("spot") is not None,
    )


@functools.cache
def packaged_data(provider: str) -> dict[str, Any]:
    """The shipped catalog of ``provider`` ("aws" or "gcp") as its JSON document."""
    if provider not in CLOUDS:
        raise ConfigError(f"there is no offer catalog for provider {provider!r}")
    text = resources.files("skyward_iac.infra").joinpath("catalog", f"{provider}.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


@functools.cache
def packaged_catalog(provider: str) -> Catalog:
    """The catalog shipped with the package for ``provider`` ("aws" or "gcp")."""
    return Catalog.from_dict(packaged_data(provider))


def refreshed_path(provider: str) -> Path:
    """Where ``skyward-iac offers refresh`` keeps ``provider``'s catalog (it may not exist)."""
    return home.skyward_home() / "catalog" / f"{provider}.json"


def write_refreshed(data: dict[str, Any]) -> Path:
    """Store a refreshed catalog document (checked by parsing it first) atomically."""
    Catalog.from_dict(data)
    path = refreshed_path(data["provider"])
    path.parent.mkdir(mode=0o700, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    partial.replace(path)
    return path


@functools.cache
def _read_refreshed(path: Path, mtime_ns: int) -> Catalog:  # mtime: a new file is read anew
    try:
        return Catalog.from_file(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"the refreshed offer catalog {path} is unreadable ({type(exc).__name__}: {exc}); "
            "run `skyward-iac offers refresh` again or delete the file"
        ) from None


def _date_key(as_of: str) -> tuple[int, ...]:
    """``as_of`` ("2025-06", "2026-11-22T08:00:00Z") as comparable numbers."""
    return tuple(int(part) for part in re.findall(r"\d+", as_of))


def current_catalog(provider: str) -> Catalog:
    """The catalog offers are selected from: the refreshed one when it is newer than the
    shipped one, else the shipped one (``Catalog.origin`` says which)."""
    shipped = packaged_catalog(provider)
    path = refreshed_path(provider)
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return shipped
    refreshed = _read_refreshed(path, mtime)
    return refreshed if _date_key(refreshed.as_of) > _date_key(shipped.as_of) else shipped


LOCAL_OFFER = Offer(provider="local", instance_type="local", region="local", vcpus=0,
                    memory_gb=0, architecture="any", on_demand=0.0, spot=None)


#: Written after an estimated price wherever one is shown.
ESTIMATE = " (est.)"


@dataclass(frozen=True, slots=True)
class Choice:
    """A spec resolved to one offer and market: what would be provisioned, and its price."""

    spec: Spec
    offer: Offer
    market: Market

    @property
    def hourly(self) -> float:
        """USD per node-hour."""
        price = self.offer.price(self.market)
        assert price is not None  # a Choice is only built for an offered market
        return price

    @property
    def nodes(self) -> int:
        """Nodes the pool starts with."""
        return self.spec.nodes.desired

    @property
    def estimated(self) -> bool:
        """Whether ``hourly`` is an estimated spot figure rather than a listed price."""
        return self.market == "spot" and self.offer.spot_estimated

    @property
    def cluster_hourly(self) -> float:
        """USD per hour for all starting nodes."""
        return self.hourly * self.nodes

    def estimate(self, hours: float) -> float:
        """Estimated USD for running the starting nodes ``hours`` hours."""
        return self.cluster_hourly * hours

    def __str__(self) -> str:
        o = self.offer
        gpu = f"{o.accelerator_count:g}x {o.accelerator} " if o.accelerator else ""
        return (f"{o.provider} {o.instance_type} ({gpu}{o.vcpus:g} vCPU, {o.memory_gb:g} GB) "
                f"{o.region} {self.market} ${self.hourly:.4f}/h{ESTIMATE if self.estimated else ''}"
                f" x {self.nodes} = ${self.cluster_hourly:.4f}/h")


def hourly_cost(choice: Choice, nodes: int, on_demand_nodes: Iterable[int] = ()) -> float:
    """USD/hour of ``nodes`` nodes of ``choice``: each at the choice's market price, except the
    ``on_demand_nodes`` (moved on demand by the spot fallback) at the on-demand price."""
    moved = len({index for index in on_demand_nodes if index < nodes})
    if not moved or choice.market == "on-demand":
        return choice.hourly * nodes
    on_demand = choice.offer.price("on-demand")
    if on_demand is None:
        raise ValueError(f"{choice.offer.instance_type} has no on-demand price")
    return choice.hourly * (nodes - moved) + on_demand * moved


def market_for(allocation: AllocationStrategy, offer: Offer) -> Market | None:
    """The market ``allocation`` uses on ``offer``, None when the offer cannot serve it.

    ``spot-if-available`` starts on spot where the offer has a spot market (the pool falls back
    to on-demand if the cloud then has no spot capacity); ``cheapest`` takes the lower price.
    """
    if allocation == "spot":
        return "spot" if offer.spot is not None else None
    if allocation == "on-demand":
        return "on-demand" if offer.on_demand is not None else None
    if allocation == "spot-if-available":
        return "spot" if offer.spot is not None else (
            "on-demand" if offer.on_demand is not None else None)
    markets: tuple[Market, ...] = ("spot", "on-demand")
    prices = [(p, m) for m in markets if (p := offer.price(m)) is not None]
    return min(prices)[1] if prices else None


def requested_region(spec: Spec) -> str | None:
    """The region a spec asks for (spec, provider or GCP zone); conflicting ones are an error."""
    zone: str | None = getattr(spec.provider, "zone", None)
    asked = [spec.region, getattr(spec.provider, "region", None),
             zone.rsplit("-", 1)[0] if zone else None]
    candidates = {region for region in asked if region}
    if len(candidates) > 1:
        raise ConfigError(
            f"the spec asks for regions {sorted(candidates)} at once (Spec.region, the "
            "provider's region and zone must agree); set just one"
        )
    return next(iter(candidates), None)


def _constraints(spec: Spec) -> list[Constraint]:
    """What an offer must have for ``spec``, in the order a refusal names them."""
    out = accelerator_constraints(spec.accelerator)
    if region := requested_region(spec):
        out.append(Constraint(f"region {region}", lambda o: o.region == region,
                               offered("regions offering it", lambda o: [o.region])))
    if zone := getattr(spec.provider, "zone", None):
        out.append(Constraint(f"zone {zone}", lambda o: zone in o.zones,
                               offered("zones offering it", lambda o: o.zones)))
    out += shape_constraints(spec)
    allocation = spec.allocation
    out.append(Constraint(f"allocation {allocation!r}",
                           lambda o: market_for(allocation, o) is not None,
                           lambda _: "none of them has that market; try allocation='on-demand'"))
    if (cap := spec.max_hourly_cost) is not None:
        out.append(Constraint(
            f"max_hourly_cost ${cap:g}", lambda o: _price(allocation, o) <= cap,
            lambda left: f"the cheapest is ${min(_price(allocation, o) for o in left):.4f}/h"))
    return out


def _price(allocation: AllocationStrategy, offer: Offer) -> float:
    market = market_for(allocation, offer)
    price = offer.price(market) if market else None
    return price if price is not None else float("inf")


def matching(spec: Spec, catalog: Catalog | None = None) -> list[Choice]:
    """Every offer that serves ``spec``, cheapest first (per node-hour, then by name).

    Raises ``ConfigError`` naming the first constraint that left no offer, what was left
    before it and what to change.
    """
    kind = spec.provider.kind
    if spec.provider.on_this_machine:
        check_local_fits(spec)  # this machine is the only offer, at the price it is given
        price = spec.provider.usd_per_hour if isinstance(spec.provider, Local) else 0.0
        return [Choice(spec, replace(LOCAL_OFFER, on_demand=price), "on-demand")]
    catalog = catalog or current_catalog(kind)
    left = list(catalog.offers)
    applied: list[str] = []
    for constraint in _constraints(spec):
        kept = [o for o in left if constraint.keep(o)]
        if not kept:
            before = f" with {', '.join(applied)}" if applied else ""
            raise ConfigError(
                f"no {kind.upper()} offer matches: {len(left)} offer(s){before}, none with "
                f"{constraint.describe} ({constraint.hint(left)}). Relax that constraint or try "
                f"another provider (catalog as of {catalog.as_of})."
            )
        applied.append(constraint.describe)
        left = kept
    # Every offer left passed the allocation constraint, so its market is never None.
    choices = [Choice(spec, o, market_for(spec.allocation, o) or "on-demand") for o in left]
    return sorted(choices, key=rank_key(choices))


def rank_key(choices: Sequence[Choice]) -> Callable[[Choice], tuple[Any, ...]]:
    """How ``matching`` orders choices: by USD/node-hour, then type and region; but an
    estimated spot price never picks the region by itself: between regions of one instance
    type, estimated spot prices count as that type's lowest estimate, and the regions' listed
    on-demand prices decide."""
    lowest: dict[str, float] = {}
    for choice in choices:
        if choice.estimated:
            kind = choice.offer.instance_type
            lowest[kind] = min(lowest.get(kind, float("inf")), choice.hourly)

    def key(choice: Choice) -> tuple[Any, ...]:
        o = choice.offer
        if choice.estimated:
            return (lowest[o.instance_type], o.on_demand or float("inf"), o.instance_type,
                    o.region)
        return (choice.hourly, 0.0, o.instance_type, o.region)

    return key


def select(specs: Sequence[Spec], selection: SelectionStrategy = "cheapest",
           catalogs: dict[str, Catalog] | None = None) -> Choice:
    """Pick one offer across several specs (multi-provider fallback).

    ``"cheapest"``: the lowest USD/hour for the starting nodes across every spec that has an
    offer; ``"first"``: the cheapest offer of the first spec that has one. When no spec has
    an offer, the ``ConfigError`` lists why for each.
    """
    return ranked(specs, selection, catalogs)[0]


def ranked(specs: Sequence[Spec], selection: SelectionStrategy = "cheapest",
           catalogs: dict[str, Catalog] | None = None) -> list[Choice]:
    """Each spec's best offer, in the order ``selection`` prefers them (``select`` takes the
    first; capacity failover tries the others in turn). Specs without an offer are left out;
    when none has one, the ``ConfigError`` lists why for each."""
    if not specs:
        raise ConfigError("select needs at least one Spec")
    found: list[Choice] = []
    reasons: list[str] = []
    for number, spec in enumerate(specs, 1):
        kind = spec.provider.kind
        try:
            found.append(matching(spec, (catalogs or {}).get(kind))[0])
        except ConfigError as exc:
            reasons.append(f"  spec {number} ({kind}): {exc}" if len(specs) > 1 else str(exc))
    if not found:
        if len(specs) == 1:
            raise ConfigError(reasons[0])
        raise ConfigError("no spec has a matching offer:\n" + "\n".join(reasons))
    if selection == "first":
        return found
    # Stable: among equal prices the earlier spec stays first.
    return sorted(found, key=lambda choice: choice.cluster_hourly)
