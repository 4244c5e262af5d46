"""Volumes and storage without I/O: validation, presets, how nodes mount each volume, the
generated mount/unmount lines, and the IAM the AWS and GCP programs add for bucket volumes."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pytest

import skyward_iac as sky
from skyward_iac.api.errors import ConfigError
from skyward_iac.api.storage import resolve_credential
from skyward_iac.api.volumes import (
    Volume,
    VolumeKeys,
    check_volumes,
    keys_for_outputs,
    keys_from_outputs,
    mount_kind,
    volume_keys,
)
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.programs.aws import aws_program, s3_volume_policy
from skyward_iac.infra.programs.exports import volume_exports
from skyward_iac.infra.programs.gcp import gcp_program
from skyward_iac.infra.programs.gcp_identity import (
    COMPUTE_SCOPE,
    OBJECT_USER,
    OBJECT_VIEWER,
    STORAGE_READ_ONLY,
    STORAGE_READ_WRITE,
    service_account_id,
)
from skyward_iac.infra.programs.testing import ProgramMocks, run_program
from skyward_iac.remote.volumes import mount_plan, mount_script, unmount_script
from skyward_iac.storage import Storage, presets

# pulumi_aws / pulumi_gcp warn about their own deprecated resources when their modules load.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MOTO = "http://127.0.0.1:9000"
KEYED = Storage(MOTO, access_key="AKIAEXAMPLE", secret_key="s3cr3t-value", path_style=True)


# -- Volume validation ---------------------------------------------------------------------


@pytest.mark.parametrize("mount", ["/", "/opt", "/opt/skyward", "/root", "/tmp", "/tmp/",
                                   "//tmp", "/opt/skyward/data", "/etc/data", "/proc", "/usr/x"])
def test_reserved_mounts_are_refused(mount: str) -> None:
    with pytest.raises(ConfigError, match="Invalid Volume:\n  mount: mount '/"):
        Volume("data", mount)


@pytest.mark.parametrize("mount", ["data", "./data", "~/data", "", "/data/../tmp", "/da ta"])
def test_relative_or_odd_mounts_are_refused(mount: str) -> None:
    with pytest.raises(ConfigError, match="mount"):
        Volume("data", mount)


@pytest.mark.parametrize(("given", "normal"), [("/data", "/data"), ("/data/", "/data"),
                                               ("/mnt//ckpt", "/mnt/ckpt"), ("/opt/x", "/opt/x"),
                                               ("/home/me/data", "/home/me/data")])
def test_good_mounts_are_normalized(given: str, normal: str) -> None:
    assert Volume("data", given).mount == normal


def test_volume_fields_positional_defaults_and_frozen() -> None:
    volume = Volume("my-data", "/data", "runs/exp1/")
    assert (volume.bucket, volume.prefix, volume.read_only, volume.storage) == (
        "my-data", "runs/exp1", True, None)
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        volume.read_only = False  # type: ignore[misc]
    assert sky.Volume is Volume if hasattr(sky, "Volume") else True


@pytest.mark.parametrize("bucket", ["", "A", "UPPER-case", "with space", "-dash", "x" * 300])
def test_bad_bucket_names(bucket: str) -> None:
    with pytest.raises(ConfigError, match="bucket"):
        Volume(bucket, "/data")


def test_bad_prefix_and_storage() -> None:
    with pytest.raises(ConfigError, match="prefix"):
        Volume("data", "/data", prefix="a/../b")
    with pytest.raises(ConfigError, match=r"storage must be a sky\.Storage"):
        Volume("data", "/data", storage="s3://data")  # type: ignore[arg-type]


def test_a_dump_never_holds_keys() -> None:
    dumped = json.dumps(Volume("data", "/data", storage=KEYED).model_dump())
    assert "s3cr3t-value" not in dumped and "AKIAEXAMPLE" not in dumped


# -- Storage and presets -------------------------------------------------------------------


@pytest.mark.parametrize(("storage", "endpoint", "region"), [
    (presets.S3(region="eu-west-1"), "https://s3.eu-west-1.amazonaws.com", "eu-west-1"),
    (presets.R2(account_id="abc123", access_key="a", secret_key="s"),
     "https://abc123.r2.cloudflarestorage.com", "auto"),
    (presets.GCS(access_key="a", secret_key="s"), "https://storage.googleapis.com", "auto"),
    (presets.Wasabi(region="eu-central-1", access_key="a", secret_key="s"),
     "https://s3.eu-central-1.wasabisys.com", "eu-central-1"),
    (presets.Backblaze(region="us-west-004", key_id="a", app_key="s"),
     "https://s3.us-west-004.backblazeb2.com", "us-west-004"),
    (presets.Hyperstack(api_key="k"), "https://ca1.obj.nexgencloud.io", "CANADA-1"),
])
def test_presets_point_at_real_endpoints(storage: Storage, endpoint: str, region: str) -> None:
    assert (storage.endpoint, storage.region) == (endpoint, region)


def test_preset_errors_and_hyperstack_path_style() -> None:
    with pytest.raises(ConfigError, match="endpoint"):
        presets.Hyperstack(api_key="k", region="MARS-1")
    assert presets.Hyperstack(api_key="k", region="MARS-1", endpoint="https://x.example").path_style
    with pytest.raises(ConfigError, match="account_id"):
        presets.R2(account_id="", access_key="a", secret_key="s")


def test_storage_checks_its_fields() -> None:
    with pytest.raises(ConfigError, match="http"):
        Storage("s3.amazonaws.com")
    with pytest.raises(ConfigError, match="both"):
        Storage(MOTO, access_key="a")
    with pytest.raises(ConfigError, match="5 MiB"):
        Storage(MOTO, part_size=1024)
    assert "s3cr3t" not in repr(KEYED) and "AKIA" not in repr(KEYED)


def test_credentials_resolve_from_strings_functions_and_coroutines() -> None:
    async def fetched() -> str:
        await asyncio.sleep(0)
        return "from-a-coroutine"

    assert resolve_credential("plain") == "plain"
    assert resolve_credential(lambda: "from-a-function") == "from-a-function"
    assert resolve_credential(fetched) == "from-a-coroutine"
    assert resolve_credential(None) is None

    async def inside_a_loop() -> str | None:  # e.g. a notebook: the loop cannot be blocked on
        return resolve_credential(fetched)

    assert asyncio.run(inside_a_loop()) == "from-a-coroutine"
    with pytest.raises(ConfigError, match="returned int"):
        resolve_credential(lambda: 42)  # type: ignore[arg-type,return-value]


# -- how nodes mount a volume --------------------------------------------------------------


R2 = presets.R2(account_id="acct", access_key="r2-key", secret_key="r2-secret")


@pytest.mark.parametrize(("volume", "provider", "kind"), [
    (Volume("ddd", "/d", storage=KEYED), "local", "s3-keys"),
    (Volume("ddd", "/d", storage=R2), "aws", "s3-keys"),
    (Volume("ddd", "/d", storage=R2), "gcp", "s3-keys"),
    (Volume("ddd", "/d"), "aws", "aws-role"),
    (Volume("ddd", "/d", storage=presets.S3(region="eu-west-1")), "aws", "aws-role"),
    (Volume("ddd", "/d"), "gcp", "gcp-service-account"),
    (Volume("ddd", "/d", storage=presets.GCS()), "gcp", "gcp-service-account"),
    (Volume("ddd", "/d", storage=Storage(MOTO)), "local", "s3-public"),
    (Volume("ddd", "/d", storage=presets.S3()), "local", "s3-public"),
])
def test_mount_kind(volume: Volume, provider: str, kind: str) -> None:
    assert mount_kind(volume, provider) == kind


def test_volumes_nodes_cannot_mount_fail_before_provisioning() -> None:
    with pytest.raises(ConfigError, match="no object store of its own"):
        mount_kind(Volume("ddd", "/d"), "local")
    with pytest.raises(ConfigError, match="read-only"):
        mount_kind(Volume("ddd", "/d", read_only=False, storage=Storage(MOTO)), "local")
    with pytest.raises(ConfigError, match="mount point of its own"):
        check_volumes([Volume("aaa", "/data", storage=KEYED),
                       Volume("bbb", "/data/", storage=KEYED)], "local")
    with pytest.raises(ConfigError, match="not inside another"):
        check_volumes([Volume("aaa", "/data", storage=KEYED),
                       Volume("bbb", "/data/sub", storage=KEYED)], "local")
    check_volumes([Volume("aaa", "/data", storage=KEYED), Volume("bbb", "/data2", storage=KEYED)],
                  "local")


def test_volume_keys_resolve_each_storage_once_and_hide_in_reprs() -> None:
    calls: list[str] = []

    def secret() -> str:
        calls.append("secret")
        return "fn-secret"

    shared = Storage(MOTO, access_key="ak", secret_key=secret, path_style=True)
    volumes = [Volume("aaa", "/a", storage=shared), Volume("bbb", "/b", storage=shared),
               Volume("ccc", "/c", storage=presets.S3())]
    keys = volume_keys(volumes, "aws")
    assert set(keys) == {0, 1} and calls == ["secret"]
    assert keys[0] == VolumeKeys("ak", "fn-secret")
    assert "fn-secret" not in repr(keys) and "ak" not in repr(keys[0])
    assert keys_from_outputs(keys_for_outputs(keys)) == keys


# -- mount and unmount lines ---------------------------------------------------------------


def local_plan() -> tuple[list[Volume], Any]:
    volumes = [Volume("data", "/data", prefix="inputs", storage=KEYED),
               Volume("ckpt", "/ckpt", read_only=False, storage=KEYED)]
    return volumes, mount_plan(volumes, "local", volume_keys(volumes, "local"))


def test_no_volumes_no_plan() -> None:
    plan = mount_plan([], "aws")
    assert not plan and plan.agent_prefix == "" and mount_script(plan, "/w") == ""


def test_local_plan_keys_only_in_0600_files() -> None:
    _, plan = local_plan()
    assert [(f.path, f.mode, f.content) for f in plan.files] == [
        ("volume-0.passwd", 0o600, b"AKIAEXAMPLE:s3cr3t-value\n"),
        ("volume-1.passwd", 0o600, b"AKIAEXAMPLE:s3cr3t-value\n"),
    ]
    text = mount_script(plan, "/w") + unmount_script(plan, "/w") + repr(plan)
    assert "s3cr3t-value" not in text and "AKIAEXAMPLE" not in text
    assert 'rm -f "$W/volume-0.passwd"' in text  # gone once s3fs has read them


def test_local_plan_mounts_in_the_node_namespace() -> None:
    _, plan = local_plan()
    script = mount_script(plan, "/w")
    assert "unshare --mount --propagation private" in script
    assert plan.agent_prefix == 'nsenter --target "$(cat "$W/run/volumes.ns")" --mount --'
    ro, rw = [line for line in plan.mount if "setsid s3fs" in line]
    assert "s3fs data:/inputs /data -f" in ro and "-o ro" in ro
    assert "s3fs ckpt /ckpt -f" in rw and "-o ro" not in rw
    for line in (ro, rw):
        assert f"-o url={MOTO}" in line and "-o use_path_request_style" in line
        assert "-o sigv4" in line and "-o allow_other" in line
    assert "apt-get update" not in script  # a Local node installs nothing behind your back
    unmount = unmount_script(plan, "/w")
    assert unmount.index("umount /ckpt") < unmount.index("umount /data")  # reverse order
    assert 'kill "$SKY_NS_PID"' in unmount


def test_aws_plan_uses_the_instance_profile() -> None:
    volumes = [Volume("datasets", "/data"),
               Volume("runs", "/ckpt", read_only=False, storage=presets.S3(region="eu-west-1"))]
    plan = mount_plan(volumes, "aws", {}, region="us-east-2")
    assert plan.files == () and plan.agent_prefix == ""
    data, ckpt = [line for line in plan.mount if "setsid s3fs" in line]
    assert "-o iam_role=auto" in data and "-o url=https://s3.us-east-2.amazonaws.com" in data
    assert "-o endpoint=us-east-2" in data and "-o ro" in data
    assert "-o url=https://s3.eu-west-1.amazonaws.com" in ckpt and "-o ro" not in ckpt
    script = mount_script(plan, "/opt/skyward")
    assert "apt-get" in script and "install -y -qq --no-install-recommends s3fs" in script
    assert "nsenter" not in script and 'SKY_SUDO="sudo -n"' in script


def test_gcp_plan_uses_gcsfuse() -> None:
    volumes = [Volume("datasets", "/data", prefix="imagenet"),
               Volume("runs", "/ckpt", read_only=False, storage=R2)]
    plan = mount_plan(volumes, "gcp", volume_keys(volumes, "gcp"))
    gcs = next(line for line in plan.mount if "setsid gcsfuse" in line)
    assert "--only-dir imagenet" in gcs and "-o ro" in gcs and gcs.endswith("datasets /data "
                                                                            "</dev/null >>"
                                                                            '"$W/log/volume-0.log"'
                                                                            " 2>&1 &")
    script = mount_script(plan, "/opt/skyward")
    assert "packages.cloud.google.com/apt gcsfuse-" in script
    assert [f.path for f in plan.files] == ["volume-1.passwd"]  # R2 still mounts with its keys
    assert "-o url=https://acct.r2.cloudflarestorage.com" in script and "-o endpoint=auto" in script


def test_missing_keys_for_a_keyed_volume() -> None:
    with pytest.raises(ConfigError, match="no resolved keys"):
        mount_plan([Volume("ddd", "/d", storage=KEYED)], "local", {})


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("provider", ["local", "aws", "gcp"])
def test_generated_scripts_are_valid_bash(provider: str) -> None:
    volumes = [Volume("data", "/data"), Volume("ckpt", "/ckpt", read_only=False, storage=KEYED)]
    if provider == "local":
        volumes[0] = Volume("data", "/data", storage=KEYED)
    plan = mount_plan(volumes, provider, volume_keys(volumes, provider), region="us-east-1")
    for script in (mount_script(plan, "/w"), unmount_script(plan, "/w")):
        checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert checked.returncode == 0, checked.stderr


# -- the cloud programs --------------------------------------------------------------------

AWS_INVOKES = {
    "aws:ec2/getAmi:getAmi": {"id": "ami-0123456789"},
    "aws:ec2/getVpc:getVpc": {"id": "vpc-default"},
    "aws:ec2/getSubnet:getSubnet": {"id": "subnet-default"},
    "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings": {
        "locations": ["us-east-1d", "us-east-1b"]},
}
CALLER = "198.51.100.7/32"


def with_volumes(spec: sky.Spec, volumes: list[Volume]) -> sky.Spec:
    """``spec`` with ``volumes`` (before Spec has the field, as an extra attribute)."""
    if "volumes" in type(spec).model_fields:
        return spec.model_copy(update={"volumes": tuple(volumes)})
    copy = spec.model_copy()
    object.__setattr__(copy, "volumes", tuple(volumes))
    return copy


@dataclass(frozen=True)
class KeyedRequest(ClusterRequest):
    """A request carrying resolved volume keys (the field the lead adds to ClusterRequest)."""

    volume_keys: Mapping[int, VolumeKeys] = field(default_factory=dict)


class AwsMocks(ProgramMocks):
    """The AWS mocks plus the names IAM computes from a ``name_prefix``."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        ident, outs = super().new_resource(args)
        if args.typ in ("aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile"):
            outs["name"] = f"{args.inputs['namePrefix']}0001"
        return ident, outs


def run_aws(volumes: list[Volume], nodes: int = 2, keys: dict[int, VolumeKeys] | None = None,
            ) -> tuple[ProgramMocks, dict[str, Any]]:
    spec = with_volumes(sky.Spec(provider=sky.AWS(ssh_cidr=CALLER)), volumes)
    request = KeyedRequest("aws-vol-test", spec, nodes, volume_keys=keys or {})
    mocks = AwsMocks(AWS_INVOKES)
    return mocks, run_program(aws_program(request), mocks)


class GcpMocks(ProgramMocks):
    """The GCP mocks plus the one output a service account computes: its email."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        ident, outs = super().new_resource(args)
        if args.typ == "gcp:serviceaccount/account:Account":
            outs["email"] = f"{args.inputs['accountId']}@my-project.iam.gserviceaccount.com"
        return ident, outs


def run_gcp(volumes: list[Volume], nodes: int = 2,
            ttl: int = 600) -> tuple[ProgramMocks, dict[str, Any]]:
    spec = with_volumes(sky.Spec(provider=sky.GCP(ssh_cidr=CALLER, project="my-project"),
                                 ttl=ttl), volumes)
    mocks = GcpMocks()
    return mocks, run_program(gcp_program(ClusterRequest("gcp-vol-test", spec, nodes)), mocks)


def test_aws_nodes_without_volumes_hold_no_credentials() -> None:
    mocks, _ = run_aws([])
    assert not [r for r in mocks.resources if r.typ.startswith("aws:iam/")]
    assert all(r.inputs.get("iamInstanceProfile") is None
               for r in mocks.of_type("aws:ec2/instance:Instance"))


def test_aws_bucket_volumes_get_an_instance_profile() -> None:
    volumes = [Volume("datasets", "/data", prefix="imagenet"),
               Volume("runs", "/ckpt", read_only=False),
               Volume("other", "/other", storage=R2)]  # keyed: not the profile's business
    mocks, _ = run_aws(volumes)
    role = mocks.named("volumes-role")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert role.inputs["namePrefix"].startswith("aws-vol-test-")
    policy = json.loads(mocks.named("volumes-policy").inputs["policy"])
    assert policy == s3_volume_policy(volumes[:2])
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert by_sid["ListVolumeBuckets"]["Resource"] == ["arn:aws:s3:::datasets",
                                                       "arn:aws:s3:::runs"]
    assert by_sid["ReadVolumeObjects"]["Resource"] == ["arn:aws:s3:::datasets/imagenet",
                                                       "arn:aws:s3:::datasets/imagenet/*",
                                                       "arn:aws:s3:::runs/*"]
    assert by_sid["WriteVolumeObjects"]["Resource"] == ["arn:aws:s3:::runs/*"]
    assert "s3:PutObject" in by_sid["WriteVolumeObjects"]["Action"]
    profile = mocks.named("volumes-profile")
    assert profile.inputs["role"] == "aws-vol-test-0001"  # the role's computed name
    instances = mocks.of_type("aws:ec2/instance:Instance")
    assert [i.inputs["iamInstanceProfile"] for i in instances] == ["aws-vol-test-0001"] * 2


def test_aws_read_only_volumes_get_no_write_actions() -> None:
    mocks, _ = run_aws([Volume("datasets", "/data")])
    policy = json.loads(mocks.named("volumes-policy").inputs["policy"])
    assert [s["Sid"] for s in policy["Statement"]] == ["ListVolumeBuckets", "ReadVolumeObjects"]


def test_keyed_volumes_export_their_keys_as_a_secret() -> None:
    keys = {0: VolumeKeys("r2-key", "r2-secret")}
    _, exports = run_aws([Volume("other", "/other", storage=R2)], keys=keys)
    assert exports["volume_keys"] == {"0": {"access_key": "r2-key", "secret_key": "r2-secret"}}
    assert volume_exports(ClusterRequest("x", sky.Spec(provider=sky.Local()), 1)) == {}
    request = KeyedRequest("x", sky.Spec(provider=sky.Local()), 1, volume_keys=keys)
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)  # Output.secret schedules its work on the current loop
        output = volume_exports(request)["volume_keys"]
        assert loop.run_until_complete(output.is_secret()) is True
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_volumes_aws_nodes_cannot_mount_fail_before_any_resource() -> None:
    spec = with_volumes(sky.Spec(provider=sky.AWS(ssh_cidr=CALLER)),
                        [Volume("ddd", "/d", read_only=False, storage=Storage(MOTO))])
    with pytest.raises(ConfigError, match="anonymously"):
        aws_program(ClusterRequest("aws-vol-test", spec, 1))


def test_gcp_nodes_without_volumes_or_ttl_have_no_service_account() -> None:
    mocks, _ = run_gcp([], ttl=0)
    assert not mocks.of_type("gcp:serviceaccount/account:Account")
    assert all(i.inputs.get("serviceAccount") is None
               for i in mocks.of_type("gcp:compute/instance:Instance"))


def test_gcp_bucket_volumes_get_a_service_account_with_storage_scopes() -> None:
    volumes = [Volume("datasets", "/data"), Volume("runs", "/ckpt", read_only=False),
               Volume("runs", "/runs-ro", prefix="old"), Volume("other", "/other", storage=R2)]
    mocks, _ = run_gcp(volumes)
    (account,) = mocks.of_type("gcp:serviceaccount/account:Account")
    assert account.inputs["accountId"] == service_account_id("gcp-vol-test")
    email = f"{account.inputs['accountId']}@my-project.iam.gserviceaccount.com"
    grants = {r.inputs["bucket"]: (r.inputs["role"], r.inputs["member"])
              for r in mocks.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")}
    assert grants == {"datasets": (OBJECT_VIEWER, f"serviceAccount:{email}"),
                      "runs": (OBJECT_USER, f"serviceAccount:{email}")}
    for instance in mocks.of_type("gcp:compute/instance:Instance"):
        assert instance.inputs["serviceAccount"] == {
            "email": email, "scopes": [COMPUTE_SCOPE, STORAGE_READ_WRITE]}


def test_gcp_read_only_volumes_get_read_only_scope() -> None:
    mocks, _ = run_gcp([Volume("datasets", "/data")], nodes=1, ttl=0)
    (instance,) = mocks.of_type("gcp:compute/instance:Instance")
    assert instance.inputs["serviceAccount"]["scopes"] == [STORAGE_READ_ONLY]


@pytest.mark.parametrize("stack", ["gcp-vol-test", "a", "A-very-long-stack-name-20261122-abcdef"])
def test_service_account_ids_are_valid(stack: str) -> None:
    import re

    assert re.fullmatch(r"[a-z][-a-z0-9]{4,28}[a-z0-9]", service_account_id(stack))


def test_long_stack_names_get_distinct_service_accounts() -> None:
    base = "gcp-a-rather-long-user-name-20261124-030000-"
    ids = {service_account_id(base + suffix) for suffix in ("aaaaaa", "bbbbbb", "cccccc")}
    assert len(ids) == 3  # the first 30 characters alone would be one id for all three
