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
        region = self.region or region
        if self.cause is not Cause.QUOTA:
            return ""
        if self.provider == "gcp":
            where = "all regions" if self.scope is Scope.GLOBAL else (region or "the region")
            return (f"raise quota {self.quota or '(named above)'} for {where}: Google Cloud "
                    "console > IAM & Admin > Quotas (filter on the metric), or see the limits "
                    "with `gcloud compute project-info describe` (global) and `gcloud compute "
                    "regions describe REGION` (regional)")
        quota = aws_quota_name(instance_type, self.spot_only) if instance_type else (
            "the Spot Instance Requests quota" if self.spot_only
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

    provider: str
    pattern: re.Pattern[str]
    code: str
    scope: Scope
    cause: Cause
    spot_only: bool = False


def _sign(provider: str, text: str, code: str, scope: Scope, cause: Cause,
          spot_only: bool = False) -> _Sign:
    return _Sign(provider, re.compile(text, re.IGNORECASE), code, scope, cause, spot_only)


#: The codes both clouds return, in the order they are looked for. AWS codes are those of
#: RunInstances (and the spot request status); GCP's are the operation's error codes and the
#: wording Compute Engine gives them.
SIGNS = (
    _sign("aws", r"\bInsufficientInstanceCapacity\b", "InsufficientInstanceCapacity",
          Scope.ZONE, Cause.CAPACITY),
    _sign("aws", r"\bcapacity-not-available\b|There is no Spot capacity available",
          "capacity-not-available", Scope.ZONE, Cause.CAPACITY, spot_only=True),
    # Spot prices differ per zone: another zone, or the on-demand market, may be under the cap.
    _sign("aws", r"\bSpotMaxPriceTooLow\b|\bprice-too-low\b", "SpotMaxPriceTooLow", Scope.ZONE,
          Cause.PRICE, spot_only=True),
    _sign("aws", r"Unsupported: Your requested instance type|is not supported in your "
          r"requested Availability Zone", "Unsupported", Scope.ZONE, Cause.UNOFFERED),
    # The account's spot limit counts every zone of the region; on demand is a separate quota.
    _sign("aws", r"\bMaxSpotInstanceCountExceeded\b|Max spot instance count exceeded",
          "MaxSpotInstanceCountExceeded", Scope.REGION, Cause.QUOTA, spot_only=True),
    _sign("aws", r"\bVcpuLimitExceeded\b", "VcpuLimitExceeded", Scope.REGION, Cause.QUOTA),
    _sign("aws", r"\bInstanceLimitExceeded\b", "InstanceLimitExceeded", Scope.REGION,
          Cause.QUOTA),
    # The program's own words when no zone of the region offers the type (aws_network.py).
    _sign("aws", r"no availability zone of \S+ offers", "NoZoneOffersType", Scope.REGION,
          Cause.UNOFFERED),
    _sign("gcp", r"\bZONE_RESOURCE_POOL_EXHAUSTED(?:_WITH_DETAILS)?\b",
          "ZONE_RESOURCE_POOL_EXHAUSTED", Scope.ZONE, Cause.CAPACITY),
    _sign("gcp", r"does not have enough resources available to fulfill the request",
          "ZONE_RESOURCE_POOL_EXHAUSTED", Scope.ZONE, Cause.CAPACITY),
    _sign("gcp", r"does not exist in zone", "UNOFFERED_IN_ZONE", Scope.ZONE, Cause.UNOFFERED),
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


def classify(line: str) -> Refusal | None:
    """The refusal one line of an engine error states, or None (another kind of error)."""
    quota = _gcp_quota(line)
    if quota is not None:
        return quota
    for sign in SIGNS:
        if sign.pattern.search(line):
            zone = (_AWS_ZONE if sign.provider == "aws" else _GCP_ZONE).search(line)
            region = zone or (_IN_REGION.search(line) if sign.provider == "gcp" else None)
            return Refusal(sign.provider, sign.code, sign.scope, sign.cause, sign.spot_only,
                           region=region.group("region") if region else None,
                           zone=zone.group("zone") if zone else None, line=line.strip())
    return None


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


def refusal_in(text: str) -> Refusal | None:
    """The widest refusal an engine error's text states (a global quota over a regional one
    over a zone's capacity), or None when no line states one."""
    found = [r for line in text.splitlines() if (r := classify(line)) is not None]
    order = list(Scope)
    return max(found, key=lambda r: order.index(r.scope), default=None)
