"""``sky.Local(first_contact_grace)``: validated like every option, and what each Local node's
watchdog is given (the stack program under Pulumi mocks; the real watchdog is
tests/integration/test_slow_bootstrap.py and tests/chaos/test_local_nodes.py)."""

from __future__ import annotations

import pytest

import skyward_iac as sky
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.programs.local import local_program
from skyward_iac.infra.programs.local_node import FIRST_CONTACT_GRACE
from skyward_iac.infra.programs.testing import ProgramMocks, run_program


@pytest.mark.parametrize("value", [0, 0.5, -3, 3601, "30", True, float("inf"), float("nan")])
def test_a_bad_first_contact_grace_is_refused(value: object) -> None:
    with pytest.raises(sky.ConfigError, match="first_contact_grace"):
        sky.Local(first_contact_grace=value)


def graces(provider: sky.Local, nodes: int = 2) -> list[object]:
    mocks = ProgramMocks()
    spec = sky.Spec(provider=provider, ttl=10)
    run_program(local_program(ClusterRequest("local-test-1", spec, nodes)), mocks)
    return [node.inputs["first_contact"] for node in mocks.resources
            if node.typ.endswith("skyward:LocalNode")]


def test_every_node_gets_the_grace_and_the_default_is_30_seconds() -> None:
    assert sky.Local().first_contact_grace == FIRST_CONTACT_GRACE == 30
    assert graces(sky.Local()) == [30, 30]
    assert graces(sky.Local(first_contact_grace=7.5)) == [7.5, 7.5]
