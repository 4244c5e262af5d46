"""Resizes and fallbacks never change a running node: the declared inputs of every existing node
are identical before and after, on AWS and GCP (Pulumi mocks; the mocks derive other resources'
outputs from their names, as a real stack keeps them). test_replacement_oracle.py checks the
same under the providers' own replacement rules, with the stack's stored decisions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.infra.programs import ClusterRequest, common
from tests.unit import test_aws_program as aws_tests
from tests.unit import test_gcp_program as gcp_tests

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
CREATED = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)
#: (run helper, spec builder, instance type token) per cloud.
CLOUDS = {
    "aws": (aws_tests.run, aws_tests.aws_spec, aws_tests.INSTANCE),
    "gcp": (gcp_tests.run, gcp_tests.gcp_spec, gcp_tests.INSTANCE),
}


def node_inputs(cloud: str, nodes: int, **request: Any) -> dict[str, dict[str, Any]]:
    """Each declared node's inputs by logical name (its boot data aside: host keys are
    generated per program run under mocks, and only boot once on a real node)."""
    run, spec, instance = CLOUDS[cloud]
    mocks, _ = run(spec(sky.accelerators.A100(count=8) if cloud == "aws" else
                        sky.accelerators.A100()), nodes, created_at=CREATED, **request)
    boot = {"userData", "metadata"}
    return {r.name: {k: v for k, v in r.inputs.items() if k not in boot}
            for r in mocks.of_type(instance)}


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
@pytest.mark.parametrize(("before", "after", "extra"), [
    (1, 2, {}),                                    # grow 1 -> 2 (placement would flip)
    (2, 1, {}),                                    # shrink 2 -> 1
    (2, 4, {}),                                    # grow further
    (2, 2, {"on_demand_nodes": frozenset({1})}),   # node 1's spot launch fell back
])
def test_existing_nodes_keep_their_inputs(cloud: str, before: int, after: int,
                                          extra: dict[str, Any]) -> None:
    old = node_inputs(cloud, before, max_nodes=4)
    new = node_inputs(cloud, after, max_nodes=4, **extra)
    changed = set(extra.get("on_demand_nodes", ()))
    for name in sorted(set(old) & set(new)):
        if int(name.rsplit("-", 1)[1]) in changed:
            continue
        assert new[name] == old[name], f"{cloud} {name} would be updated or replaced"


def test_placement_is_decided_from_the_pools_maximum() -> None:
    spec = aws_tests.aws_spec()
    alone = common.plan_cluster(ClusterRequest("s", spec, 1))
    elastic = common.plan_cluster(ClusterRequest("s", spec, 1, max_nodes=4))
    assert not alone.placement and elastic.placement
    # A fixed pool created with one node and resized to two keeps its head as it was.
    resized = common.plan_cluster(ClusterRequest("s", spec, 2, max_nodes=1))
    assert not resized.placement


def test_tags_do_not_move_with_the_clock() -> None:
    spec = aws_tests.aws_spec()
    first = common.plan_cluster(ClusterRequest("s", spec, 1, created_at=CREATED)).tags
    later = common.plan_cluster(ClusterRequest("s", spec, 3, created_at=CREATED)).tags
    assert first == later
