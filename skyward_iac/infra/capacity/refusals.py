"""What a cloud's refusal to launch means, decided once: how far away another try may succeed.

A launch the cloud refuses for capacity, quota, price or offering names its reason with the
cloud's own error code, and the code says where trying again can help (``Scope``): another zone
of the same region (AWS ``InsufficientInstanceCapacity``, GCP ``ZONE_RESOURCE_POOL_EXHAUSTED``),
only another region (AWS ``VcpuLimitExceeded``, GCP ``QUOTA_EXCEEDED`` for a regional metric
such as ``NVIDIA_L4_GPUS``), or nowhere on that cloud until a quota is raised (GCP
``GPUS_ALL_REGIONS``, 0 on new projects). ``refusal_in`` reads an engine error into a
``Refusal``; the node fallback (``spot_fallback.py``) and capacity failover (``failover.py``)
spend their attempts by it. Pure: text in, a value out.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass


class Scope(enum.Enum):
    """How far the refusal reaches: where another try cannot help."""

    #: This zone only: a sibling zone of the region may launch it.
    ZONE = "zone"
    #: Every zone of the region: only another region may.
    REGION = "region"
    #: Every region of the cloud (an account- or project-wide quota).
    GLOBAL = "global"


class Cause(enum.Enum):
    """Why the cloud refused."""

    CAPACITY = "no capacity"
    QUOTA = "quota"
    PRICE = "spot price above the cap"
    UNOFFERED = "type not offered"


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refusal, classified."""

    provider: str
    #: The cloud's own code (``InsufficientInstanceCapacity``, ``QUOTA_EXCEEDED`` ...).
    code: str
    scope: Scope
    cause: Cause
    #: Only the spot market is refused: an on-demand launch in the same place may succeed.
    spot_only: bool = False
    #: The quota's name where the cloud gives one (GCP metric, e.g. ``GPUS_ALL_REGIONS``).
    quota: str | None = None
    #: The region the cloud names in the message, if any.
    region: str | None = None
    #: The zone the cloud names (AWS: "the Availability Zone you requested (us-east-1a)").
    zone: str | None = None
    #: The line of the error that said it (for events and logs).
    line: str = ""

    def describe(self) -> str:
        """``InsufficientInstanceCapacity (no capacity, zone)``: the code, cause and scope."""
        what = f"{self.code} {self.quota}" if self.quota else self.code
        return f"{what} ({self.cause.value}, {self.scope.value})"

    def how_to_raise(self, instance_type: str | None = None, region: str | None = None) -> str:
        """Where the user asks for more of a quota ("" for refusals that are not quotas);
        ``instance_type`` names the AWS quota (they count vCPUs per family of types), ``region``
        the region refused when the message names none."""
        if self.cause is not Cause.QUOTA:
            return ""
        return DIALECTS[self.provider].advice(self, instance_type, self.region or region)


def _gcp_advice(refusal: Refusal, instance_type: str | None, region: str | None) -> str:
    where = "all regions" if refusal.scope is Scope.GLOBAL else (region or "the region")
    return (f"raise quota {refusal.quota or '(named above)'} for {where}: Google Cloud "
            "console > IAM & Admin > Quotas (filter on the metric), or see the limits "
            "with `gcloud compute project-info describe` (global) and `gcloud compute "
            "regions describe REGION` (regional)")


def _aws_advice(refusal: Refusal, instance_type: str | None, region: str | None) -> str:
    quota = aws_quota_name(instance_type, refusal.spot_only) if instance_type else (
        "the Spot Instance Requests quota" if refusal.spot_only
        else "the Running On-Demand instances quota")
    return (f"raise {quota} (vCPUs) in {region or 'the region'}: Service Quotas console "
            "> Amazon EC2, or `aws service-quotas list-service-quotas --service-code ec2` "
            "and `aws service-quotas request-service-quota-increase`")


#: EC2's vCPU quotas by the letters that open an instance type's name.
_AWS_FAMILIES = (("trn", "Trn"), ("inf", "Inf"), ("dl", "DL"), ("vt", "G and VT"),
                 ("g", "G and VT"), ("p", "P"), ("f", "F"), ("x", "X"))
_AWS_STANDARD = "Standard (A, C, D, H, I, M, R, T, Z)"


def aws_quota_name(instance_type: str, spot: bool) -> str:
    """The name of the EC2 quota ``instance_type`` counts against ("Running On-Demand P
    instances", "All G and VT Spot Instance Requests" ...)."""
    family = next((name for prefix, name in _AWS_FAMILIES if instance_type.startswith(prefix)),
                  _AWS_STANDARD)
    return f"'All {family} Spot Instance Requests'" if spot else \
        f"'Running On-Demand {family} instances'"


@dataclass(frozen=True, slots=True)
class _Sign:
    """An error code (or the cloud's fixed wording for it) and what it means."""

    pattern: re.Pattern[str]
    code: str
    scope: Scope
    cause: Cause
    spot_only: bool = False


def _sign(text: str, code: str, scope: Scope, cause: Cause, spot_only: bool = False) -> _Sign:
    return _Sign(re.compile(text, re.IGNORECASE), code, scope, cause, spot_only)


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one cloud words its refusals: its codes, where it names the zone or region, and
    where its users raise a quota. One per cloud (``DIALECTS``), so no reader asks which."""

    provider: str
    #: Its codes, in the order they are looked for.
    signs: tuple[_Sign, ...]
    #: A zone named in its errors, with the region it belongs to (groups ``zone``, ``region``).
    zone: re.Pattern[str]
    #: Where it asks for more of a quota (``Refusal.how_to_raise``).
    advice: Callable[[Refusal, str | None, str | None], str]
    #: A region named without a zone (group ``region``); None: it names none so.
    region: re.Pattern[str] | None = None
    #: A reader of its quota refusals, whose metric decides their scope; None: its signs do.
    quota: Callable[[str], Refusal | None] | None = None

    def classify(self, line: str) -> Refusal | None:
        """The refusal ``line`` states in this cloud's words, or None."""
        for sign in self.signs:
            if sign.pattern.search(line):
                zone = self.zone.search(line)
                region = zone or (self.region.search(line) if self.region else None)
                return Refusal(self.provider, sign.code, sign.scope, sign.cause, sign.spot_only,
                               region=region.group("region") if region else None,
                               zone=zone.group("zone") if zone else None, line=line.strip())
        return None


#: AWS codes are those of RunInstances (and the spot request status).
AWS_SIGNS = (
    _sign(r"\bInsufficientInstanceCapacity\b", "InsufficientInstanceCapacity",
          Scope.ZONE, Cause.CAPACITY),
    _sign(r"\bcapacity-not-available\b|There is no Spot capacity available",
          "capacity-not-available", Scope.ZONE, Cause.CAPACITY, spot_only=True),
    # Spot prices differ per zone: another zone, or the on-demand market, may be under the cap.
    _sign(r"\bSpotMaxPriceTooLow\b|\bprice-too-low\b", "SpotMaxPriceTooLow", Scope.ZONE,
          Cause.PRICE, spot_only=True),
    _sign(r"Unsupported: Your requested instance type|is not supported in your "
          r"requested Availability Zone", "Unsupported", Scope.ZONE, Cause.UNOFFERED),
    # The account's spot limit counts every zone of the region; on demand is a separate quota.
    _sign(r"\bMaxSpotInstanceCountExceeded\b|Max spot instance count exceeded",
          "MaxSpotInstanceCountExceeded", Scope.REGION, Cause.QUOTA, spot_only=True),
    _sign(r"\bVcpuLimitExceeded\b", "VcpuLimitExceeded", Scope.REGION, Cause.QUOTA),
    _sign(r"\bInstanceLimitExceeded\b", "InstanceLimitExceeded", Scope.REGION, Cause.QUOTA),
    # The program's own words when no zone of the region offers the type (aws_network.py).
    _sign(r"no availability zone of \S+ offers", "NoZoneOffersType", Scope.REGION,
          Cause.UNOFFERED),
)
#: GCP's are the operation's error codes and the wording Compute Engine gives them.
GCP_SIGNS = (
    _sign(r"\bZONE_RESOURCE_POOL_EXHAUSTED(?:_WITH_DETAILS)?\b",
          "ZONE_RESOURCE_POOL_EXHAUSTED", Scope.ZONE, Cause.CAPACITY),
    _sign(r"does not have enough resources available to fulfill the request",
          "ZONE_RESOURCE_POOL_EXHAUSTED", Scope.ZONE, Cause.CAPACITY),
    _sign(r"does not exist in zone", "UNOFFERED_IN_ZONE", Scope.ZONE, Cause.UNOFFERED),
)
#: GCP names the quota: ``Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1.``;
#: an operation's error, as terraform-provider-google writes it (``ComputeOperationError`` in
#: compute_operation.go), adds ``metric name = compute.googleapis.com/nvidia_l4_gpus`` and
#: prints no code, and its own tests quote the message without the quotes.
GCP_QUOTA = re.compile(r"Quota '?(?P<metric>[A-Z0-9_]+)'? exceeded|metric name = "
                       r"compute\.googleapis\.com/(?P<metric_name>[a-z0-9_]+)", re.IGNORECASE)
GCP_QUOTA_CODE = re.compile(r"\bQUOTA_EXCEEDED\b|\bquotaExceeded\b")
_IN_REGION = re.compile(r"\bin region (?P<region>[a-z]+-[a-z]+\d+)")
_AWS_ZONE = re.compile(r"\b(?P<zone>(?P<region>[a-z]{2}(?:-gov)?-[a-z]+-\d)[a-z])\b")
_GCP_ZONE = re.compile(r"zones/(?P<zone>(?P<region>[a-z]+-[a-z]+\d)-[a-z])\b")


def _gcp_quota(line: str) -> Refusal | None:
    """A GCP quota refusal: global for ``*_ALL_REGIONS`` metrics (and "Limit: ... globally"),
    else regional; a ``PREEMPTIBLE_*`` metric limits spot VMs only."""
    named = GCP_QUOTA.search(line)
    if named is None and not GCP_QUOTA_CODE.search(line):
        return None
    metric = (named.group("metric") or named.group("metric_name")).upper() if named else None
    everywhere = bool(metric and metric.endswith("_ALL_REGIONS")) or "globally" in line
    region = _IN_REGION.search(line)
    return Refusal("gcp", "QUOTA_EXCEEDED", Scope.GLOBAL if everywhere else Scope.REGION,
                   Cause.QUOTA, spot_only=bool(metric and metric.startswith("PREEMPTIBLE_")),
                   quota=metric, region=region.group("region") if region else None,
                   line=line.strip())


AWS_WORDS = Dialect("aws", AWS_SIGNS, _AWS_ZONE, _aws_advice)
GCP_WORDS = Dialect("gcp", GCP_SIGNS, _GCP_ZONE, _gcp_advice, region=_IN_REGION,
                    quota=_gcp_quota)
#: Each cloud's words by its kind.
DIALECTS = {d.provider: d for d in (AWS_WORDS, GCP_WORDS)}


def classify(line: str) -> Refusal | None:
    """The refusal one line of an engine error states, or None (another kind of error): a
    quota named with its metric first, then each cloud's codes."""
    for dialect in DIALECTS.values():
        if dialect.quota is not None and (quota := dialect.quota(line)) is not None:
            return quota
    return next((r for d in DIALECTS.values() if (r := d.classify(line)) is not None), None)


def refusal_in(text: str) -> Refusal | None:
    """The widest refusal an engine error's text states (a global quota over a regional one
    over a zone's capacity), or None when no line states one."""
    found = [r for line in text.splitlines() if (r := classify(line)) is not None]
    order = list(Scope)
    return max(found, key=lambda r: order.index(r.scope), default=None)
