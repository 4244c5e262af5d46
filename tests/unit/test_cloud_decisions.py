"""What a cloud stack decides once (programs/decisions.py): the first run records it, the stack
stores it, and later runs -- from any process, with any request -- declare what is stored."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.programs import ClusterRequest, decisions, pins
from skyward_iac.infra.programs.aws import aws_program
from skyward_iac.infra.programs.gcp import gcp_program
from skyward_iac.infra.programs.testing import AWS_INVOKES, ProgramMocks, run_program
from skyward_iac.infra.stacks import stack as stack_module
from tests.unit import test_aws_program as aws_tests
from tests.unit import test_gcp_program as gcp_tests

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
CREATED = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)
SPEC = aws_tests.aws_spec(sky.accelerators.A100(count=8))


def request(nodes: int = 2, **fields: Any) -> ClusterRequest:
    values: dict[str, Any] = {"created_at": CREATED, "max_lifetime": 3600, "max_nodes": nodes,
                              "tags": {"team": "a"}, "offer": offers.select([SPEC]).offer,
                              **fields}
    return ClusterRequest("decided", SPEC, nodes, **values)


def first_run(req: ClusterRequest) -> dict[str, str]:
    """What a stack stores after its first successful update for ``req``."""
    program = aws_program(req, lambda: aws_tests.CALLER)
    run_program(program, ProgramMocks(AWS_INVOKES))
    return program.unstored()


# -- decide: pure ----------------------------------------------------------------------------


def test_a_first_run_decides_from_its_request() -> None:
    decided = decisions.decide(request(), {})
    assert decided.offer == request().offer and decided.max_nodes == 2
    assert decided.max_lifetime == 3600 and decided.tags["team"] == "a"
    assert (decided.zone, decided.image, dict(decided.nodes)) == (None, None, {})


def test_the_stored_identity_wins_over_another_process_request() -> None:
    stored = first_run(request())
    adopter = request(created_at=datetime(2026, 12, 1, tzinfo=UTC), tags={"team": "b"},
                      max_lifetime=7200, max_nodes=8)
    decided = decisions.decide(adopter, stored)
    assert decided.tags == decisions.decide(request(), stored).tags
    assert decided.tags["team"] == "a" and decided.max_lifetime == 3600
    assert decided.max_nodes == 2


def test_no_lifetime_is_stored_as_zero() -> None:
    stored = first_run(request(max_lifetime=None))
    assert stored[pins.MAX_LIFETIME] == "0"
    assert decisions.decide(request(max_lifetime=600), stored).max_lifetime is None


def test_a_pool_with_nodes_stays_where_they_run() -> None:
    stored = first_run(request())
    moved = next(o for o in offers.current_catalog("aws").offers
                 if o.instance_type == "p4de.24xlarge" and o.region != "us-east-1")
    decided = decisions.decide(request(offer=moved), stored)
    assert decided.offer.region == "us-east-1"
    assert decided.image == stored[pins.IMAGE] and decided.zone == stored[pins.ZONE]


def test_a_pool_without_nodes_moves_with_its_request() -> None:
    stored = {k: v for k, v in first_run(request()).items() if k != pins.NODES}
    moved = next(o for o in offers.current_catalog("aws").offers
                 if o.instance_type == "p4de.24xlarge" and o.region != "us-east-1")
    decided = decisions.decide(request(offer=moved), stored)
    # Another region: its own image and zone, looked up by the run.
    assert decided.offer == moved and decided.image is None and decided.zone is None
    # A zone capacity failover chose wins over the stored one while nothing runs.
    assert decisions.decide(request(zone="us-east-1f"), stored).zone == "us-east-1f"


def test_a_request_for_another_cloud_cannot_update_a_running_stack() -> None:
    stored = first_run(request())
    other = ClusterRequest("decided", gcp_tests.gcp_spec(), 2)
    with pytest.raises(sky.ConfigError, match="runs aws nodes"):
        decisions.decide(other, stored)


@pytest.mark.parametrize(("key", "value", "message"), [
    (pins.TAGS, "[1, 2]", "JSON object"),
    (pins.MAX_NODES, "two", "whole number"),
    (pins.NODES, '{"0": "ami-1"}', "node indexes"),
])
def test_unreadable_pins_are_config_errors(key: str, value: str, message: str) -> None:
    stored = {**first_run(request()), key: value}
    with pytest.raises(sky.ConfigError, match=message):
        decisions.decide(request(), stored)


def test_a_place_the_catalog_lost_is_a_config_error() -> None:
    stored = {**first_run(request()), pins.PLACE: "aws:mars-north-1:p4de.24xlarge"}
    with pytest.raises(sky.ConfigError, match="no longer lists"):
        decisions.decide(request(), stored)


# -- what a run records --------------------------------------------------------------------


def test_a_first_run_records_everything_a_later_run_needs() -> None:
    stored = first_run(request())
    assert set(stored) == set(pins.DECIDED)
    assert stored[pins.IMAGE] == AWS_INVOKES["aws:ec2/getAmi:getAmi"]["id"]
    assert stored[pins.ZONE] == "us-east-1b"  # the first zone the catalog row (p4de) lists
    assert json.loads(stored[pins.NODES]) == {
        "0": {"image": stored[pins.IMAGE], "zone": "us-east-1b"},
        "1": {"image": stored[pins.IMAGE], "zone": "us-east-1b"}}


def test_a_later_run_declares_the_stored_values_without_asking() -> None:
    stored = first_run(request())
    config = pins.config_values(stored)
    mocks = ProgramMocks({**AWS_INVOKES, "aws:ec2/getAmi:getAmi": {"id": "ami-newer"}})
    program = aws_program(request(), lambda: aws_tests.CALLER)
    run_program(program, mocks, config)
    assert program.unstored() == {}
    assert not [c for c in mocks.calls if c[0] in ("aws:ec2/getAmi:getAmi",
                "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings")]
    assert {r.inputs["ami"] for r in mocks.of_type("aws:ec2/instance:Instance")} == {
        stored[pins.IMAGE]}
    # A resize stores only the new node table.
    program = aws_program(replace(request(), node_count=3), lambda: aws_tests.CALLER)
    run_program(program, ProgramMocks(mocks.invokes), config)
    assert set(program.unstored()) == {pins.NODES}


def test_gcp_records_each_nodes_zone_and_image_by_self_link() -> None:
    req = ClusterRequest("decided", gcp_tests.gcp_spec(sky.accelerators.L4()), 2)
    program = gcp_program(req, lambda: gcp_tests.CALLER)
    mocks = ProgramMocks()
    run_program(program, mocks)
    stored = program.unstored()
    assert stored[pins.IMAGE].startswith("https://www.googleapis.com/compute/v1/projects/"
                                         "ubuntu-os-accelerator-images/global/images/")
    zone = stored[pins.ZONE]
    assert json.loads(stored[pins.NODES])["1"] == {"image": stored[pins.IMAGE], "zone": zone}
    for node in mocks.of_type("gcp:compute/instance:Instance"):
        assert node.inputs["bootDisk"]["initializeParams"]["image"] == stored[pins.IMAGE]
        assert node.inputs["zone"] == zone


# -- ClusterStack stores them --------------------------------------------------------------


class FakeLean:
    """The Automation API stack: its workspace's program and the config writes."""

    name = "decided"

    def __init__(self, program: Any) -> None:
        self.workspace = type("Workspace", (), {"program": program})()
        self.written: list[dict[str, str]] = []

    def set_all_config(self, config: dict[str, Any]) -> None:
        self.written.append({key: value.value for key, value in config.items()})


def test_cluster_stack_stores_what_a_successful_run_decided() -> None:
    program = aws_program(request(), lambda: aws_tests.CALLER)
    run_program(program, ProgramMocks(AWS_INVOKES))
    lean = FakeLean(program)
    stack = stack_module.ClusterStack(lean)  # type: ignore[arg-type]
    stack._store_decisions()
    assert lean.written == [pins.config_values(program.unstored())]
    assert lean.written[0][f"skyward:{pins.PLACE}"] == "aws:us-east-1:p4de.24xlarge"
    # Nothing new decided, or no cloud program: no engine command.
    lean.workspace.program = lambda: None
    stack._store_decisions()
    assert len(lean.written) == 1
