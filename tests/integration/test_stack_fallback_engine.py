"""An update whose identity GCP refuses runs again without it, through the real engine.

``ClusterStack.up`` hands a failed update's errors to its program's ``fallback``
(``stacks/fallbacks.py``); the GCP program's (``gcp_identity.program_fallback``) recognises
GCP's refusal to create the nodes' service account. Here a dynamic resource under the account's
logical name fails with that refusal's text (terraform-provider-google-beta's wrapping of the
IAM API's answer) until the stack's config says to go without it, as the GCP program declares
no account then: the real engine runs both updates, the decision is stored in the stack's
config, and a failure no fallback covers stays the update's error.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pulumi
import pulumi.dynamic
import pytest

from skyward_iac.api.errors import ProvisionError
from skyward_iac.infra.engine.lean_stack import LeanStack
from skyward_iac.infra.programs import pins
from skyward_iac.infra.programs.decisions import Recorder, StackProgram
from skyward_iac.infra.programs.gcp_identity import ACCOUNT, NodeIdentity, program_fallback
from skyward_iac.infra.stacks import stack as stack_module

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ORG_POLICY = (
    "Error creating service account: googleapi: Error 400: Service account creation is not "
    "allowed on this project.\nDetails:\n[{\"@type\": \"type.googleapis.com/google.rpc."
    "PreconditionFailure\", \"violations\": [{\"type\": "
    "\"constraints/iam.disableServiceAccountCreation\"}]}]")
NO_CAPACITY = ("The zone 'projects/p/zones/us-central1-a' does not have enough resources "
               "available to fulfill the request.")


class Refused(pulumi.dynamic.ResourceProvider):
    """A resource the cloud refuses with the text it is given."""

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        raise RuntimeError(props["refusal"])


class RefusedResource(pulumi.dynamic.Resource):
    def __init__(self, name: str, refusal: str) -> None:
        super().__init__(Refused(), name, {"refusal": refusal})


def program(refusal: str, seen: list[dict[str, str]]) -> StackProgram:
    """A GCP-like program: the account is declared (and refused) until the stack stores
    ``identity: none``."""
    identity = NodeIdentity("own", self_delete=True, buckets={})

    def declare(stored: Mapping[str, str], record: Recorder) -> dict[str, Any]:
        seen.append(dict(stored))
        if stored.get(pins.IDENTITY) != "none":
            RefusedResource(ACCOUNT, refusal)
        return {"nodes": [], "ssh_private_key": "", "agent_token": ""}  # a cluster of none

    return StackProgram("gcp", declare, program_fallback("fallback-engine", identity))


@pytest.fixture
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dynamic provider is pickled by module path: its process must import this module."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))


@pytest.mark.usefixtures("importable")
def test_a_refused_service_account_is_gone_without_and_the_update_runs_again(
        caplog: pytest.LogCaptureFixture) -> None:
    seen: list[dict[str, str]] = []
    lean = LeanStack.create("fallback-engine", stack_module._workspace(
        program(ORG_POLICY, seen), None))
    stack = stack_module.ClusterStack(lean)
    try:
        with caplog.at_level(logging.WARNING):
            stack.up()
        assert [s.get(pins.IDENTITY) for s in seen] == [None, "none"]  # two engine runs
        assert lean.get_all_config()[f"skyward:{pins.IDENTITY}"].value == "none"
        warnings = [r.getMessage() for r in caplog.records
                    if "refused the nodes' identity" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert "Service account creation is not allowed on this project" in warnings[0]
        assert "stays stopped" in warnings[0]
        results = [u.result for u in stack.history()]
        assert results == ["succeeded", "failed"], results
    finally:
        stack.remove()


@pytest.mark.usefixtures("importable")
def test_a_failure_no_fallback_covers_stays_the_updates_error() -> None:
    seen: list[dict[str, str]] = []
    lean = LeanStack.create("fallback-engine-2", stack_module._workspace(
        program(NO_CAPACITY, seen), None))
    stack = stack_module.ClusterStack(lean)
    try:
        with pytest.raises(ProvisionError, match="does not have enough resources"):
            stack.up()
        assert len(seen) == 1
        assert f"skyward:{pins.IDENTITY}" not in lean.get_all_config()
    finally:
        stack.destroy()
        stack.remove()
