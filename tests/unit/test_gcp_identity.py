"""What GCP nodes run as (programs/gcp_identity.py): the stack's own account with one
permission, a given account, none at all, and the fallback when GCP refuses to create it.

The refusals are the provider's own error texts: terraform-provider-google-beta v7.45.0 (what
pulumi-gcp 9.x bridges; 10.x bridges 8.x, these files unchanged up to the snapshot read,
docs/providers.md) wraps the IAM API's error as
``Error creating service account: %s`` (resource_google_service_account.go),
``Error creating the custom project role %s: %v`` (resource_google_project_iam_custom_role.go)
and ``Error applying IAM policy for %s: ...`` (tpgiamresource/iam.go), each around a
``googleapi: Error <code>: <message>`` whose details name the org policy's constraint.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pulumi
import pytest

import skyward_iac as sky
from skyward_iac.api.volumes import Volume
from skyward_iac.infra.programs import ClusterRequest, common, pins
from skyward_iac.infra.programs.gcp import gcp_program
from skyward_iac.infra.programs.gcp_identity import (
    ACCOUNT,
    COMPUTE_SCOPE,
    ROLE,
    SELF_DELETE_PERMISSIONS,
    NodeIdentity,
    identity_fallback,
    node_identity,
    program_fallback,
    self_delete_role_id,
)
from skyward_iac.infra.programs.testing import ProgramMocks, run_program

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
CALLER = "198.51.100.7/32"
STACK = "gcp-alice-20261125-203700-a1b2c3"
GIVEN = "nodes@my-project.iam.gserviceaccount.com"
INSTANCE = "gcp:compute/instance:Instance"
ACCOUNT_TYPE = "gcp:serviceaccount/account:Account"
ROLE_TYPE = "gcp:projects/iAMCustomRole:IAMCustomRole"
BINDING_TYPE = "gcp:compute/instanceIAMMember:InstanceIAMMember"
IDENTITY_TYPES = (ACCOUNT_TYPE, ROLE_TYPE, BINDING_TYPE)

ORG_POLICY = (
    "Error creating service account: googleapi: Error 400: Service account creation is not "
    "allowed on this project.\nDetails:\n[\n  {\n    \"@type\": \"type.googleapis.com/"
    "google.rpc.PreconditionFailure\",\n    \"violations\": [\n      {\n        \"subject\": "
    "\"projects/my-project\",\n        \"type\": \"constraints/iam.disableServiceAccountCreation"
    "\"\n      }\n    ]\n  }\n]")
NO_ACCOUNT_PERMISSION = (
    "Error creating service account: googleapi: Error 403: Permission "
    "'iam.serviceAccounts.create' denied on resource (or it may not exist)., forbidden")
NO_ROLE_PERMISSION = (
    "Error creating the custom project role projects/my-project/roles/skyward_x: googleapi: "
    "Error 403: Permission 'iam.roles.create' denied on resource (or it may not exist)., "
    "forbidden")
NO_SET_IAM_POLICY = (
    "Error applying IAM policy for compute instance \"projects/my-project/zones/us-central1-a/"
    "instances/n-node-0\": Error setting IAM policy for compute instance: googleapi: Error 403: "
    "Required 'compute.instances.setIamPolicy' permission for 'projects/my-project/zones/"
    "us-central1-a/instances/n-node-0', forbidden")
ALREADY_EXISTS = ("Error creating service account: googleapi: Error 409: Service account "
                  "skyward-x already exists within project projects/my-project., alreadyExists")
NO_CAPACITY = ("The zone 'projects/my-project/zones/us-central1-a' does not have enough "
               "resources available to fulfill the request.  '(resource type:compute)'.")


class Mocks(ProgramMocks):
    """The GCP mocks plus the output a service account computes: its email."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        ident, outs = super().new_resource(args)
        if args.typ == ACCOUNT_TYPE:
            outs["email"] = f"{args.inputs['accountId']}@my-project.iam.gserviceaccount.com"
        return ident, outs


def spec(service_account: str | None = "auto", **fields: Any) -> sky.Spec:
    return sky.Spec(provider=sky.GCP(ssh_cidr=CALLER, project="my-project",
                                     service_account=service_account), **fields)


def run(spec: sky.Spec, nodes: int = 2, identity: str | None = None) -> Mocks:
    mocks = Mocks()
    config = {f"{pins.NAMESPACE}:{pins.IDENTITY}": identity} if identity else {}
    run_program(gcp_program(ClusterRequest(STACK, spec, nodes)), mocks, config)
    return mocks


def watchdog(instance: Any) -> str:
    files = json.loads(instance.inputs["metadata"]["user-data"].removeprefix(
        "#cloud-config\n"))["write_files"]
    return next(f["content"] for f in files if f["path"].endswith("skyward-watchdog"))


def test_the_setting_is_auto_none_or_an_account_email() -> None:
    assert sky.GCP().service_account == "auto"
    assert sky.GCP(service_account=None).service_account is None
    assert sky.GCP(service_account="none").service_account is None  # a config file's None
    assert sky.GCP(service_account=GIVEN).service_account == GIVEN
    for bad in ("nodes", "nodes@example.com", "AUTO", ""):
        with pytest.raises(sky.ConfigError, match="service_account"):
            sky.GCP(service_account=bad)


def test_the_self_delete_role_holds_exactly_the_one_permission_the_fire_path_uses() -> None:
    """The fire path (cloud_init.gce_self_delete) makes one call, DELETE on its own instance;
    the role the stack creates for it grants that and nothing else, bound per instance."""
    mocks = run(spec())
    (role,) = mocks.of_type(ROLE_TYPE)
    assert role.name == ROLE and role.inputs["permissions"] == ["compute.instances.delete"]
    assert list(SELF_DELETE_PERMISSIONS) == ["compute.instances.delete"]
    assert role.inputs["roleId"] == self_delete_role_id(STACK)
    role_name = f"projects/my-project/roles/{self_delete_role_id(STACK)}"
    (account,) = mocks.of_type(ACCOUNT_TYPE)
    email = f"{account.inputs['accountId']}@my-project.iam.gserviceaccount.com"
    bindings = mocks.of_type(BINDING_TYPE)
    assert [(b.name, b.inputs["instanceName"], b.inputs["role"], b.inputs["member"])
            for b in bindings] == [
        (f"node-{i}-self-delete", f"{STACK}-node-{i}", role_name, f"serviceAccount:{email}")
        for i in (0, 1)]
    assert not [r for r in mocks.resources if "projectIam" in r.typ or "roles/compute." in
                str(r.inputs.get("role"))]
    for instance in mocks.of_type(INSTANCE):
        assert instance.inputs["serviceAccount"] == {"email": email, "scopes": [COMPUTE_SCOPE]}
        assert "-X DELETE" in watchdog(instance)


@pytest.mark.parametrize("stack", [STACK, "a", "x" * 120, "gcp-bob-20261125-203700-a1b2c3"])
def test_role_ids_are_valid_and_distinct(stack: str) -> None:
    import re

    role_id = self_delete_role_id(stack)
    assert re.fullmatch(r"[a-zA-Z0-9_.]{3,64}", role_id)
    assert self_delete_role_id(stack + "1") != role_id


@pytest.mark.parametrize("stored", ["none", None])
def test_no_account_declares_no_identity_and_no_self_delete(stored: str | None) -> None:
    """Opted out (service_account=None) or degraded (GCP refused to create it): no account,
    role or binding, no service_account block, and a watchdog that only powers off."""
    mocks = run(spec(None if stored is None else "auto"), identity=stored)
    assert not [r for r in mocks.resources if r.typ in IDENTITY_TYPES]
    for instance in mocks.of_type(INSTANCE):
        assert instance.inputs.get("serviceAccount") is None
        assert "-X DELETE" not in watchdog(instance) and "poweroff" in watchdog(instance)


def test_a_refused_grant_keeps_the_account_the_nodes_were_created_with() -> None:
    """``account``: the role or a binding was refused after the nodes were created with the
    account; changing an instance's account stops it, so they keep it, with no grant."""
    mocks = run(spec(), identity="account")
    assert len(mocks.of_type(ACCOUNT_TYPE)) == 1
    assert not mocks.of_type(ROLE_TYPE) and not mocks.of_type(BINDING_TYPE)
    for instance in mocks.of_type(INSTANCE):
        assert instance.inputs["serviceAccount"]["scopes"] == [COMPUTE_SCOPE]
        assert "-X DELETE" in watchdog(instance)  # a refused DELETE falls through to power-off


def test_a_given_account_is_granted_what_the_own_one_would_be() -> None:
    volumes = (Volume("datasets", "/data"),)
    mocks = run(spec(GIVEN, volumes=volumes))
    assert not mocks.of_type(ACCOUNT_TYPE)
    assert {b.inputs["member"] for b in mocks.of_type(BINDING_TYPE)} == {f"serviceAccount:{GIVEN}"}
    (grant,) = mocks.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    assert (grant.inputs["bucket"], grant.inputs["member"]) == ("datasets",
                                                                f"serviceAccount:{GIVEN}")
    assert {i.inputs["serviceAccount"]["email"] for i in mocks.of_type(INSTANCE)} == {GIVEN}


def test_no_ttl_and_no_volumes_need_no_identity() -> None:
    mocks = run(spec(ttl=0))
    assert not [r for r in mocks.resources if r.typ in IDENTITY_TYPES]


def test_bucket_volumes_without_an_account_fail_before_any_resource() -> None:
    volumes = (Volume("datasets", "/data"),)
    with pytest.raises(sky.ConfigError, match="service_account=None"):
        gcp_program(ClusterRequest(STACK, spec(None, volumes=volumes), 1))


def _identity(**fields: Any) -> NodeIdentity:
    values: dict[str, Any] = {"account": "own", "self_delete": True, "buckets": {}, **fields}
    return NodeIdentity(**values)


@pytest.mark.parametrize(("name", "text", "expected"), [
    (ACCOUNT, ORG_POLICY, "none"),
    (ACCOUNT, NO_ACCOUNT_PERMISSION, "none"),
    (ROLE, NO_ROLE_PERMISSION, "account"),
    ("node-1-self-delete", NO_SET_IAM_POLICY, "account"),
    ("node-0", NO_CAPACITY, None),  # capacity is failover's business, not the identity's
    (ACCOUNT, ALREADY_EXISTS, None),
    ("network", NO_SET_IAM_POLICY, None),  # not an identity resource
])
def test_refusals_are_recognised_by_resource_and_text(name: str, text: str,
                                                       expected: str | None) -> None:
    found = identity_fallback(_identity(), {name: text})
    assert (found[0] if found else None) == expected


def test_a_pool_whose_volumes_need_the_account_does_not_go_without_it() -> None:
    """gcsfuse mounts as the account: without it the volumes cannot work, so the refusal
    stands as the pool's error."""
    assert identity_fallback(_identity(buckets={"d": "r"}), {ACCOUNT: ORG_POLICY}) is None
    assert identity_fallback(_identity(account="given", email=GIVEN), {ACCOUNT: ORG_POLICY}) \
        is None


def test_the_fallback_stores_the_decision_and_warns_what_the_nodes_lose() -> None:
    fallback = program_fallback(STACK, _identity())({ACCOUNT: ORG_POLICY, "node-0": "x"})
    assert fallback is not None and fallback.values == {pins.IDENTITY: "none"}
    assert "Service account creation is not allowed on this project" in fallback.warning
    assert "stays stopped" in fallback.warning and "service_account=None" in fallback.warning
    assert program_fallback(STACK, _identity())({"node-0": NO_CAPACITY}) is None


def test_node_identity_reads_the_stored_fallback() -> None:
    plan = common.plan_cluster(ClusterRequest(STACK, spec(), 2))
    assert node_identity(plan, "auto") == NodeIdentity("own", None, True, {})
    assert node_identity(plan, "auto", "account") == NodeIdentity("own", None, False, {})
    assert node_identity(plan, "auto", "none") == NodeIdentity("none")
    assert node_identity(plan, None) == NodeIdentity("none")
    assert node_identity(plan, GIVEN, "none").account == "given"  # nothing was created
    with pytest.raises(sky.ConfigError, match="skyward:identity"):
        node_identity(plan, "auto", "nothing")


def test_replacement_oracle_going_without_the_grant_keeps_every_running_node() -> None:
    """The role was refused after the nodes were created with the account (the bindings wait
    for the role, the nodes do not): the update that goes without it, and a resize after it,
    keep every running node as it is (replacement oracle's engine model)."""
    from tests.unit.replacement_engine import INSTANCES, ModelStack

    stack = ModelStack(lambda request: gcp_program(request, lambda: CALLER))
    request = ClusterRequest(STACK, spec(), 2)
    assert stack.up(request).succeeded
    for key in [k for k in stack.state if k[0] in (ROLE_TYPE, BINDING_TYPE)]:
        del stack.state[key]  # refused: never created
    stack.config[f"{pins.NAMESPACE}:{pins.IDENTITY}"] = "account"
    for count in (2, 3):
        result = stack.up(replace(request, node_count=count))
        nodes = {name: result.outcomes[(typ, name)].op for typ, name in result.outcomes
                 if typ in INSTANCES}
        assert nodes == {"node-0": "same", "node-1": "same",
                         **({"node-2": "create"} if count == 3 else {})}
        assert not [t for t, _ in stack.state if t in (ROLE_TYPE, BINDING_TYPE)]
        assert not result.deleted
