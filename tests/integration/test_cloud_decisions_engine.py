"""What a cloud program decided reaches the next run through the real engine's stack config.

``ClusterStack`` stores a ``StackProgram``'s decisions once an engine run succeeded; the next
run -- here another preview, as the apply of a reviewed plan would be -- reads them back as the
stack's config. The program declares no cloud resource (no provider plugin is needed), only
what it read and what it decided.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from skyward_iac.infra.engine.lean_stack import LeanStack
from skyward_iac.infra.programs import pins
from skyward_iac.infra.programs.decisions import Recorder, StackProgram, canonical
from skyward_iac.infra.stacks import stack as stack_module

pytestmark = pytest.mark.integration
NODES = canonical({"0": {"image": "ami-0001", "zone": "us-east-1b"}})


def test_decisions_stored_after_a_run_reach_the_next_one() -> None:
    seen: list[dict[str, str]] = []

    def declare(stored: Mapping[str, str], record: Recorder) -> dict[str, Any]:
        seen.append(dict(stored))
        record.record(pins.IMAGE, "ami-0001")
        record.record(pins.NODES, NODES)
        return {}

    program = StackProgram("aws", declare)
    name = "decisions-engine"
    lean = LeanStack.create(name, stack_module._workspace(program, None))
    stack = stack_module.ClusterStack(lean)
    try:
        stack.preview()
        assert seen == [{}]
        stored = lean.get_all_config()
        assert stored[f"skyward:{pins.IMAGE}"].value == "ami-0001"
        assert json.loads(stored[f"skyward:{pins.NODES}"].value) == json.loads(NODES)
        stack.preview()  # a later run, as the apply of a reviewed plan
        assert seen[1] == {pins.IMAGE: "ami-0001", pins.NODES: NODES}
        assert program.unstored() == {}  # nothing new: no second config write
    finally:
        stack.remove()
