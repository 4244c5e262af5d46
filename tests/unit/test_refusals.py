"""The classification of the clouds' refusals: each code, its scope, and what to do about it.

The messages are the clouds' own wording as terraform-provider-aws and -google pass them on
(RunInstances API errors; Compute Engine operation errors).
"""

from __future__ import annotations

import pytest

from skyward_iac.infra.capacity.refusals import (
    Cause,
    Scope,
    aws_quota_name,
    classify,
    refusal_in,
)

AWS = "creating EC2 Instance: operation error EC2: RunInstances, https response error StatusCode: "
CASES = [
    # (message, provider, code, scope, cause, spot only, quota)
    (AWS + "500, api error InsufficientInstanceCapacity: We currently do not have sufficient "
     "p4d.24xlarge capacity in the Availability Zone you requested (us-east-1a). You can "
     "currently get p4d.24xlarge capacity by not specifying an Availability Zone in your request "
     "or choosing us-east-1b, us-east-1c.",
     "aws", "InsufficientInstanceCapacity", Scope.ZONE, Cause.CAPACITY, False, None),
    (("spot request status capacity-not-available: There is no Spot capacity available that "
     "matches your request."), "aws", "capacity-not-available", Scope.ZONE, Cause.CAPACITY, True,
     None),
    (AWS + "400, api error SpotMaxPriceTooLow: Your Spot request price of 0.3 is lower than the "
     "minimum required Spot request fulfillment price of 0.41.", "aws", "SpotMaxPriceTooLow",
     Scope.ZONE, Cause.PRICE, True, None),
    (AWS + "400, api error Unsupported: Your requested instance type (p5.48xlarge) is not "
     "supported in your requested Availability Zone (us-west-2e).", "aws", "Unsupported",
     Scope.ZONE, Cause.UNOFFERED, False, None),
    (AWS + "400, api error MaxSpotInstanceCountExceeded: Max spot instance count exceeded",
     "aws", "MaxSpotInstanceCountExceeded", Scope.REGION, Cause.QUOTA, True, None),
    (AWS + "400, api error VcpuLimitExceeded: You have requested more vCPU capacity than your "
     "current vCPU limit of 0 allows for the instance bucket that the specified instance type "
     "belongs to.", "aws", "VcpuLimitExceeded", Scope.REGION, Cause.QUOTA, False, None),
    (AWS + "400, api error InstanceLimitExceeded: You have requested more instances (21) than "
     "your current instance limit of 20 allows", "aws", "InstanceLimitExceeded", Scope.REGION,
     Cause.QUOTA, False, None),
    (("Error waiting for instance to create: The zone 'projects/p/zones/us-central1-a' does not "
     "have enough resources available to fulfill the request.  '(resource type:compute)'."),
     "gcp", "ZONE_RESOURCE_POOL_EXHAUSTED", Scope.ZONE, Cause.CAPACITY, False, None),
    ("Error waiting for instance to create: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
     "gcp", "ZONE_RESOURCE_POOL_EXHAUSTED", Scope.ZONE, Cause.CAPACITY, False, None),
    (("Error creating instance: googleapi: Error 400: Invalid value for field "
     "'resource.machineType': 'zones/us-central1-f/machineTypes/a3-highgpu-8g'. Machine type "
     "with name 'a3-highgpu-8g' does not exist in zone 'us-central1-f'., invalid"), "gcp",
     "UNOFFERED_IN_ZONE", Scope.ZONE, Cause.UNOFFERED, False, None),
    (("Error creating instance: googleapi: Error 403: Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: "
     "1.0 in region us-central1., quotaExceeded"), "gcp", "QUOTA_EXCEEDED", Scope.REGION,
     Cause.QUOTA, False, "NVIDIA_L4_GPUS"),
    (("Error waiting for instance to create: Quota 'GPUS' exceeded.  Limit: 0.0 in region "
     "us-east1."), "gcp", "QUOTA_EXCEEDED", Scope.REGION, Cause.QUOTA, False, "GPUS"),
    (("Error 403: Quota 'PREEMPTIBLE_NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region "
     "us-central1."), "gcp", "QUOTA_EXCEEDED", Scope.REGION, Cause.QUOTA, True,
     "PREEMPTIBLE_NVIDIA_T4_GPUS"),
    ("Error 403: Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally., quotaExceeded",
     "gcp", "QUOTA_EXCEEDED", Scope.GLOBAL, Cause.QUOTA, False, "GPUS_ALL_REGIONS"),
    ("Error 403: Quota 'CPUS_ALL_REGIONS' exceeded.  Limit: 32.0 globally.", "gcp",
     "QUOTA_EXCEEDED", Scope.GLOBAL, Cause.QUOTA, False, "CPUS_ALL_REGIONS"),
]


@pytest.mark.parametrize(("message", "provider", "code", "scope", "cause", "spot_only", "quota"),
                         CASES, ids=[f"{c[1]}-{c[2]}-{c[3].value}" for c in CASES])
def test_the_cloud_codes_are_classified(message: str, provider: str, code: str, scope: Scope,
                                        cause: Cause, spot_only: bool, quota: str | None) -> None:
    refusal = classify(message)
    assert refusal is not None
    assert (refusal.provider, refusal.code, refusal.scope, refusal.cause, refusal.spot_only,
            refusal.quota) == (provider, code, scope, cause, spot_only, quota)


@pytest.mark.parametrize("message", [
    "api error UnauthorizedOperation: You are not authorized to perform this operation.",
    "api error InvalidAMIID.NotFound: The image id '[ami-1]' does not exist",
    "api error Unsupported: The requested configuration is currently not supported.",
    "googleapi: Error 403: Required 'compute.instances.create' permission for 'projects/p'",
    "error: no space left on device",
])
def test_other_errors_are_no_refusal_of_the_place(message: str) -> None:
    assert refusal_in(message) is None


def test_the_zone_and_region_named_are_kept() -> None:
    aws = classify(CASES[0][0])
    assert aws is not None and (aws.zone, aws.region) == ("us-east-1a", "us-east-1")
    gcp = classify(CASES[7][0])
    assert gcp is not None and (gcp.zone, gcp.region) == ("us-central1-a", "us-central1")
    quota = classify(CASES[10][0])
    assert quota is not None and (quota.zone, quota.region) == (None, "us-central1")


def test_the_widest_refusal_of_an_error_wins() -> None:
    """One update refused node 0 in its zone and node 1 by a global quota: the quota decides."""
    text = "\n".join(["error: update failed", CASES[7][0], CASES[13][0]])
    refusal = refusal_in(text)
    assert refusal is not None and refusal.scope is Scope.GLOBAL


def test_how_to_raise_names_the_quota() -> None:
    gcp = classify(CASES[13][0])
    assert gcp is not None and "GPUS_ALL_REGIONS for all regions" in gcp.how_to_raise()
    aws = classify(CASES[5][0])
    assert aws is not None
    assert "'Running On-Demand P instances' (vCPUs) in us-east-1" in aws.how_to_raise(
        "p5.48xlarge", "us-east-1")
    capacity = classify(CASES[0][0])
    assert capacity is not None and capacity.how_to_raise() == ""


@pytest.mark.parametrize(("instance_type", "spot", "name"), [
    ("g5.xlarge", False, "'Running On-Demand G and VT instances'"),
    ("p4d.24xlarge", True, "'All P Spot Instance Requests'"),
    ("trn1.32xlarge", False, "'Running On-Demand Trn instances'"),
    ("inf2.xlarge", True, "'All Inf Spot Instance Requests'"),
    ("m7i.large", False, "'Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances'"),
])
def test_aws_quota_names(instance_type: str, spot: bool, name: str) -> None:
    assert aws_quota_name(instance_type, spot) == name
