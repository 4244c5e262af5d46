"""GCP nodes in every zone of their region: a refused node moves to a sibling zone, each node's
zone is decided once, and quota refusals are read by scope (capacity/refusals.py).

A GCP subnetwork spans its region, so a node of a pool without a compact placement policy may
run in any zone that offers the type; a compact placement policy (and a zone the user set)
holds the pool in one zone, which capacity failover moves as a whole. The error texts are the
provider's: terraform-provider-google-beta v7.45.0 writes an operation's error as its message
plus, for a quota, ``metric name = ...`` lines (``ComputeOperationError``, compute_operation.go).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.capacity.refusals import Scope, refusal_in
from skyward_iac.infra.capacity.spot_fallback import node_retry
from skyward_iac.infra.capacity.zones import nodes_move_alone
from skyward_iac.infra.programs import ClusterRequest, pins
from skyward_iac.infra.programs.gcp import gcp_program
from skyward_iac.infra.programs.testing import ProgramMocks, run_program
from tests.unit.replacement_engine import ModelStack

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
CALLER = "198.51.100.7/32"
INSTANCE = "gcp:compute/instance:Instance"
BINDING = "gcp:compute/instanceIAMMember:InstanceIAMMember"
EXHAUSTED = ("The zone 'projects/my-project/zones/us-central1-a' does not have enough "
             "resources available to fulfill the request.  '(resource type:compute)'.")
REGIONAL_QUOTA = ("Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1.\n"
                  "\tmetric name = compute.googleapis.com/nvidia_l4_gpus\n"
                  "\tlimit name = NVIDIA-L4-GPUS-per-project-region\n")
GLOBAL_QUOTA = ("Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.\n"
                "\tmetric name = compute.googleapis.com/gpus_all_regions\n"
                "\tlimit name = GPUS-ALL-REGIONS-per-project\n")


def spec(accelerator: Any = None, zone: str | None = None, **fields: Any) -> sky.Spec:
    provider = sky.GCP(ssh_cidr=CALLER, project="my-project", zone=zone)
    values: dict[str, Any] = {"allocation": "on-demand", **({} if accelerator else {"vcpus": 8}),
                              **fields}
    return sky.Spec(provider=provider, accelerator=accelerator, **values)


def request(nodes: int, spec_: sky.Spec | None = None, **fields: Any) -> ClusterRequest:
    spec_ = spec_ or spec()
    return ClusterRequest("gcp-zones", spec_, nodes, offer=offers.select([spec_]).offer, **fields)


def declared(req: ClusterRequest, config: dict[str, str] | None = None
             ) -> tuple[dict[str, str], dict[str, str]]:
    """Each node's zone and each binding's zone, as the program declares them."""
    mocks = ProgramMocks()
    run_program(gcp_program(req, lambda: CALLER), mocks, config)
    return ({i.name: i.inputs["zone"] for i in mocks.of_type(INSTANCE)},
            {b.name: b.inputs["zone"] for b in mocks.of_type(BINDING)})


def test_which_gcp_pools_may_move_a_node_alone() -> None:
    assert nodes_move_alone(request(2))  # CPU: no placement policy
    assert nodes_move_alone(request(4, spec(sky.accelerators.T4())))  # N1: no compact policy
    assert not nodes_move_alone(request(4, spec(sky.accelerators.L4())))  # G2: compact policy
    assert nodes_move_alone(request(1, spec(sky.accelerators.L4())))  # one node: no policy
    assert not nodes_move_alone(request(2, spec(zone="us-central1-b")))  # the user's zone


def test_a_refused_node_is_declared_in_the_next_zone_and_the_others_stay() -> None:
    first = request(2)
    assert first.offer is not None and first.offer.zones[:2] == ("us-central1-a",
                                                                 "us-central1-b")
    retry = node_retry(first, {1: EXHAUSTED})
    assert retry is not None and dict(retry.node_zones) == {1: "us-central1-b"}
    assert not retry.on_demand_nodes  # a sibling zone before another market
    zones, bindings = declared(retry)
    assert zones == {"node-0": "us-central1-a", "node-1": "us-central1-b"}
    assert bindings == {"node-0-self-delete": "us-central1-a",
                        "node-1-self-delete": "us-central1-b"}


def test_a_compact_placement_pool_stays_in_one_zone() -> None:
    """Its nodes move together (capacity failover); a moved zone given anyway is not used."""
    pool = request(2, spec(sky.accelerators.L4()))
    assert node_retry(pool, {1: EXHAUSTED}, defer_zonal=True) is None
    zones, _ = declared(replace(pool, node_zones={1: "us-central1-b"}))
    assert set(zones.values()) == {"us-central1-a"}


def test_replacement_oracle_each_node_keeps_its_zone_through_resizes_and_adoption() -> None:
    """Decided once: node 1, moved to b, stays there when the pool grows, when a request with
    no moved nodes runs the update (another process adopting it) and when it shrinks; new
    nodes go to the pool's zone; the stack stores every node's zone."""
    stack = ModelStack(lambda req: gcp_program(req, lambda: CALLER))
    first = request(2)
    assert not stack.up(first, refused=[1]).succeeded
    moved = node_retry(first, {1: EXHAUSTED})
    assert moved is not None and stack.up(moved).succeeded
    for count in (3, 4, 2):
        result = stack.up(replace(first, node_count=count))  # no node_zones: a later process
        assert result.succeeded
        zones = {name: inputs["zone"] for (typ, name), inputs in result.declared.items()
                 if typ == INSTANCE}
        expected = {"node-0": "us-central1-a", "node-1": "us-central1-b",
                    "node-2": "us-central1-a", "node-3": "us-central1-a"}
        assert zones == {n: z for n, z in expected.items() if int(n[-1]) < count}
        for name in ("node-0", "node-1"):
            assert result.outcomes[(INSTANCE, name)].op == "same"
    stored = json.loads(stack.config[f"{pins.NAMESPACE}:{pins.NODES}"])
    assert {i: pin["zone"] for i, pin in stored.items()}["1"] == "us-central1-b"
    assert stack.config[f"{pins.NAMESPACE}:{pins.ZONE}"] == "us-central1-a"


def test_quota_refusals_are_read_by_scope_in_the_providers_own_wording() -> None:
    regional, everywhere = refusal_in(REGIONAL_QUOTA), refusal_in(GLOBAL_QUOTA)
    assert regional is not None and (regional.scope, regional.quota, regional.region) == (
        Scope.REGION, "NVIDIA_L4_GPUS", "us-central1")
    assert everywhere is not None and (everywhere.scope, everywhere.quota) == (
        Scope.GLOBAL, "GPUS_ALL_REGIONS")
    # compute_operation_test.go's own message has no quotes; the metric line says it anyway.
    unquoted = refusal_in("Quota DISKS_TOTAL_GB exceeded.  Limit: 1100.0 in region "
                          "us-central1.\n\tmetric name = compute.googleapis.com/"
                          "disks_total_storage\n")
    assert unquoted is not None and unquoted.scope is Scope.REGION
    # A quota is no zone's: no node moves to a sibling zone for it (failover decides).
    pool = request(2, spec(sky.accelerators.T4()))
    assert node_retry(pool, {1: REGIONAL_QUOTA}) is None
    assert node_retry(pool, {1: GLOBAL_QUOTA}) is None
