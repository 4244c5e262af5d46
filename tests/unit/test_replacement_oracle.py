"""The replacement oracle: no transition of a pool replaces, or stops, anything it runs.

Each case drives the real AWS or GCP program through the updates a pool goes through (resizes,
spot fallback, capacity failover, a warm adopter's update, a newer image, a reviewed plan) on a
``ModelStack`` (replacement_engine.py), which diffs every declared resource against the stack's
state under the providers' own rules (programs/replacement.py). A step fails when a resource the
pool ran before it would be replaced or stopped, when a resource other than a retired node is
deleted, or kept only because ``ignore_changes`` hides that the program declares it otherwise,
and when the nodes of one pool would boot different images.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import pytest

import skyward_iac as sky
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.capacity.failover import alternatives
from skyward_iac.infra.capacity.spot_fallback import node_retry
from skyward_iac.infra.capacity.zones import nodes_move_alone
from skyward_iac.infra.programs import ClusterRequest, common
from skyward_iac.infra.programs.aws import aws_program
from skyward_iac.infra.programs.gcp import gcp_program
from tests.unit import test_aws_program as aws_tests
from tests.unit import test_gcp_program as gcp_tests
from tests.unit.replacement_engine import INSTANCES, ModelStack, Result, Stored

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
STACK = "oracle-pool"
CREATED = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)
ADOPTED = datetime(2026, 11, 24, 9, 30, tzinfo=UTC)
#: The cloud refuses a node in its zone (AWS's words; the classification is the same on GCP).
NO_CAPACITY = ("api error InsufficientInstanceCapacity: We currently do not have sufficient "
               "capacity in the Availability Zone you requested")
#: Inputs a preview cannot know (outputs of the stack's own keys, created by the apply).
UNKNOWN_AT_PREVIEW = {"userData", "metadata", "publicKey"}
_NODE = re.compile(r"^node-(\d+)(?:-|$)")


@dataclass(frozen=True)
class Cloud:
    """A pool on one cloud: its spec and how to build its program."""

    name: str
    spec: sky.Spec
    program: Callable[[ClusterRequest], Callable[[], None]]

    def request(self, nodes: int, *, max_nodes: int | None = None, **fields: Any
                ) -> ClusterRequest:
        """The request ``plan_pool`` builds for a new pool of ``nodes`` (fixed unless
        ``max_nodes``), created at ``CREATED`` by a user tagging it ``team=a``."""
        values: dict[str, Any] = {"created_at": CREATED, "max_lifetime": 6 * 3600,
                                  "tags": {"team": "a"}, **fields}
        return ClusterRequest(STACK, self.spec, nodes, offer=offers.select([self.spec]).offer,
                              max_nodes=max_nodes or nodes, **values)

    def adopter(self, nodes: int) -> ClusterRequest:
        """What a later process builds when it adopts the pool warm (``PoolPlan.adopting``):
        its own creation time, tags, lifetime and offer, no zone."""
        return self.request(nodes, created_at=ADOPTED, tags={"team": "b"},
                            max_lifetime=12 * 3600)

    def stack(self) -> ModelStack:
        return ModelStack(self.program)


#: The rule that opens the agents' data port, per cloud (``common.ingress_rules``).
DATA_RULE = {"aws": ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "ingress-data"),
             "gcp": ("gcp:compute/firewall:Firewall", "firewall-data")}


def _aws(request: ClusterRequest) -> Callable[[], None]:
    return aws_program(request, lambda: aws_tests.CALLER)


def _gcp(request: ClusterRequest) -> Callable[[], None]:
    return gcp_program(request, lambda: gcp_tests.CALLER)


SPOT = "spot-if-available"
#: AWS: an EFA type (launch template, placement group) in the default VPC, a GPU type without
#: EFA (placement group, plain interface) in a VPC of the pool's own, and a CPU type in a VPC of
#: its own (no placement group: a subnet per zone, each node in its own zone). GCP: a G2 type
#: (compact placement, Canonical's accelerator image) and a CPU type (Ubuntu LTS image).
CLOUDS = {
    "aws-efa": Cloud("aws", aws_tests.aws_spec(sky.accelerators.A100(count=8), allocation=SPOT),
                     _aws),
    "aws-vpc": Cloud("aws", aws_tests.aws_spec(sky.accelerators.A10G(), allocation=SPOT,
                                               use_default_vpc=False), _aws),
    "aws-cpu": Cloud("aws", aws_tests.aws_spec(None, allocation=SPOT, vcpus=4,
                                               use_default_vpc=False), _aws),
    "gcp-gpu": Cloud("gcp", gcp_tests.gcp_spec(sky.accelerators.L4(), allocation=SPOT), _gcp),
    "gcp-cpu": Cloud("gcp", gcp_tests.gcp_spec(None, allocation=SPOT, vcpus=8), _gcp),
}


def step(stack: ModelStack, request: ClusterRequest, refused: Iterable[int] = ()) -> Result:
    """One update, checked: nothing running before it is replaced, stopped or deleted (but
    retired nodes), and all nodes boot one image."""
    before = dict(stack.state)
    result = stack.up(request, refused)
    assert_kept(before, result, request.node_count)
    if result.succeeded:
        assert_one_image(stack)
    return result


def assert_kept(before: dict[tuple[str, str], Stored], result: Result, nodes: int) -> None:
    if not any(typ in INSTANCES for typ, _ in before):
        return  # nothing ran: a new pool, or one capacity failover may still move
    problems = []
    for key in before:
        outcome = result.outcomes.get(key)
        if outcome is None:
            if not _retired(key[1], nodes):
                problems.append(f"{key[1]} ({key[0]}) deleted")
        elif outcome.op in ("replace", "stop", "hidden"):
            problems.append(f"{key[1]} ({key[0]}) {outcome.op}: {', '.join(outcome.paths)}")
    assert not problems, "running resources disturbed:\n  " + "\n  ".join(sorted(problems))


def _retired(name: str, nodes: int) -> bool:
    found = _NODE.match(name)
    return found is not None and int(found.group(1)) >= nodes


def assert_one_image(stack: ModelStack) -> None:
    images = stack.node_images()
    assert len(set(images.values())) <= 1, f"one pool, several images: {images}"


# -- the transitions ----------------------------------------------------------------------------


def fixed_resize(*counts: int) -> Callable[[Cloud], None]:
    def run(cloud: Cloud) -> None:
        stack, request = cloud.stack(), cloud.request(counts[0])
        step(stack, request)
        for count in counts[1:]:
            # request_for: the request in force at another size; max_nodes stays the start.
            step(stack, replace(request, node_count=count))
    return run


def elastic(start: int, then: int) -> Callable[[Cloud], None]:
    def run(cloud: Cloud) -> None:
        stack, request = cloud.stack(), cloud.request(start, max_nodes=4)
        step(stack, request)
        step(stack, replace(request, node_count=then))
    return run


def spot_fallback(cloud: Cloud) -> None:
    """Node 1 is refused; the node fallback moves it (to a sibling zone where nodes move alone,
    else on demand) while node 0 runs; then the pool grows."""
    stack, request = cloud.stack(), cloud.request(2)
    assert not step(stack, request, refused=[1]).succeeded
    retry = node_retry(request, {1: NO_CAPACITY})
    assert retry is not None
    if nodes_move_alone(request):
        assert retry.node_zones.keys() == {1} and not retry.on_demand_nodes
        assert not step(stack, retry, refused=[1]).succeeded  # refused there too
        retry = node_retry(retry, {1: NO_CAPACITY}, {1: {(z, "spot") for z in
                                                        retry.node_zones.values()}})
        assert retry is not None and len(set(retry.node_zones.values())) == 1
    else:
        assert retry.on_demand_nodes == {1}
    step(stack, retry)
    step(stack, replace(retry, node_count=3))


def _moved(request: ClusterRequest, where: Callable[[Any], bool]) -> ClusterRequest:
    """The request capacity failover runs next (``up_with_failover``)."""
    place = next(a for a in alternatives(request) if where(a.request))
    return replace(place.request, node_count=request.node_count,
                   on_demand_nodes=request.on_demand_nodes)


def _after_move(cloud: Cloud, stack: ModelStack, moved: ClusterRequest) -> None:
    """A pool that moved: its later resize, then a warm adopter's update (no zone, its own
    offer), keep every node where it runs."""
    step(stack, moved)
    step(stack, replace(moved, node_count=3))
    step(stack, cloud.adopter(3))


def zone_failover(cloud: Cloud) -> None:
    """A zone refuses the pool: a pool whose nodes move only together moves to the next zone
    (capacity failover, nothing of it runs yet); otherwise the refused node moves alone."""
    stack, request = cloud.stack(), cloud.request(2)
    if nodes_move_alone(request):
        assert not step(stack, request, refused=[0]).succeeded
        retry = node_retry(request, {0: NO_CAPACITY})
        assert retry is not None and retry.node_zones.keys() == {0}
        _after_move(cloud, stack, retry)
        return
    assert not step(stack, request, refused=[0, 1]).succeeded
    _after_move(cloud, stack, _moved(request, lambda r: r.zone is not None))


def offerings_change(cloud: Cloud) -> None:
    """The catalog's zones change under a running pool (the pool's zone is no longer listed):
    a resize and a warm adopter's update keep every node where it runs."""
    stack, request = cloud.stack(), cloud.request(2, max_nodes=4)
    step(stack, request)
    assert request.offer is not None and len(request.offer.zones) > 1
    moved = replace(request.offer, zones=request.offer.zones[1:][::-1])
    step(stack, replace(request, node_count=3, offer=moved))
    step(stack, replace(cloud.adopter(3), offer=moved))


def region_failover(cloud: Cloud) -> None:
    stack, request = cloud.stack(), cloud.request(2)
    assert not step(stack, request, refused=[0, 1]).succeeded
    assert request.offer is not None
    _after_move(cloud, stack, _moved(
        request, lambda r: r.offer is not None and r.offer.region != request.offer.region))


def warm_adoption(cloud: Cloud) -> None:
    stack = cloud.stack()
    step(stack, cloud.request(2))
    step(stack, cloud.adopter(2))
    step(stack, cloud.adopter(3))


def newer_image(cloud: Cloud) -> None:
    stack, request = cloud.stack(), cloud.request(2, max_nodes=4)
    step(stack, request)
    stack.images.publish()
    step(stack, request)
    step(stack, replace(request, node_count=3))


def reviewed_plan(cloud: Cloud) -> None:
    """``skyward-iac plan`` previews the new stack and saves the engine's plan; a newer image
    is published; the apply (another process, later) must declare exactly what was planned."""
    stack, request = cloud.stack(), cloud.request(2)
    planned = stack.preview(request)
    stack.images.publish()
    applied = step(stack, request).declared
    differences = [f"{name} ({typ}): {path}" for (typ, name), inputs in sorted(planned.items())
                   for path in _differing(inputs, applied.get((typ, name), {}))]
    assert not differences, "the apply strays from the plan:\n  " + "\n  ".join(differences)


def _differing(planned: dict[str, Any], applied: dict[str, Any]) -> list[str]:
    return sorted(key for key in set(planned) | set(applied)
                  if key not in UNKNOWN_AT_PREVIEW and planned.get(key) != applied.get(key))


def unchanged(cloud: Cloud) -> None:
    stack, request = cloud.stack(), cloud.request(2)
    step(stack, request)
    step(stack, request)


def data_port_opened(cloud: Cloud) -> None:
    """A pool created before its firewall opened the agents' data port: the update that opens
    it creates that one rule (a rule of its own on AWS, ``AuthorizeSecurityGroupIngress`` on
    the running group; a firewall of its own on GCP), changes nothing else, and a resize
    after it keeps every node."""
    stack, request = cloud.stack(), cloud.request(2)
    current = common.ingress_rules
    with mock.patch.object(common, "ingress_rules", lambda cidr: tuple(
            rule for rule in current(cidr) if rule.name != "data")):
        before = step(stack, request)
    assert DATA_RULE[cloud.name] not in before.declared
    opened = step(stack, request)
    changed = {key: outcome.op for key, outcome in opened.outcomes.items()
               if outcome.op != "same"}
    assert changed == {DATA_RULE[cloud.name]: "create"}
    step(stack, replace(request, node_count=3))


TRANSITIONS: dict[str, Callable[[Cloud], None]] = {
    "fixed 1->2": fixed_resize(1, 2),
    "fixed 1->2->4": fixed_resize(1, 2, 4),
    "fixed 1->2->4->1": fixed_resize(1, 2, 4, 1),
    "elastic grow 1->3": elastic(1, 3),
    "elastic shrink 3->1": elastic(3, 1),
    "spot fallback": spot_fallback,
    "zone failover": zone_failover,
    "offerings change": offerings_change,
    "region failover": region_failover,
    "warm adoption": warm_adoption,
    "newer image": newer_image,
    "reviewed plan": reviewed_plan,
    "re-up unchanged": unchanged,
    "data port opened": data_port_opened,
}


@pytest.mark.parametrize("transition", sorted(TRANSITIONS))
@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_replacement_oracle(cloud: str, transition: str) -> None:
    TRANSITIONS[transition](CLOUDS[cloud])
