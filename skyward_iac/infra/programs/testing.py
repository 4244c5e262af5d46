"""Pulumi mocks for unit-testing stack programs without an engine, a cloud or plugins.

``ProgramMocks`` records every resource and invoke a program makes. Dynamic resources (the
stack's credentials, node host keys) run their real provider's ``create``, so tests see real
keys; cloud resources echo their inputs plus the computed outputs the programs read (addresses,
names, self links), derived from each resource's logical name so that two runs of a program
see the same values, as a real stack's later updates do. Each resource's ``ignore_changes`` is
recorded too (``ProgramMocks.ignored``). Remember the mock conventions: inputs arrive camelCase
with numbers as floats, and default providers never reach the mock.

    mocks = ProgramMocks(invokes={"aws:ec2/getAmi:getAmi": {"id": "ami-123"}})
    pulumi.runtime.set_mocks(mocks, preview=False)
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dill  # type: ignore[import-untyped]
import pulumi
from pulumi.runtime.config import CONFIG
from pulumi.runtime.mocks import MockMonitor

DYNAMIC_PREFIX = "pulumi-python:dynamic"
#: What the AWS program asks the cloud while it runs (AMI, default VPC and subnet, the zones
#: offering the type), answered for ``ProgramMocks(AWS_INVOKES)``.
AWS_INVOKES: Mapping[str, Mapping[str, Any]] = {
    "aws:ec2/getAmi:getAmi": {"id": "ami-0123456789"},
    "aws:ec2/getVpc:getVpc": {"id": "vpc-default"},
    "aws:ec2/getSubnet:getSubnet": {"id": "subnet-default"},
    "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings": {
        "locations": ["us-east-1d", "us-east-1b", "us-east-1c"]},
}
GCP_IMAGE_TOKEN = "gcp:compute/getImage:getImage"
GCP_IMAGES = "https://www.googleapis.com/compute/v1/projects/{project}/global/images/{name}"


def gcp_image(family: str | None, project: str | None, version: str = "v20260101") -> dict[str, Any]:
    """What ``compute.getImage`` answers for the newest image of ``family``: its name (the
    family's name and a date, as Canonical names its images) and self link."""
    name = f"{family}-{version}"
    return {"name": name, "family": family, "project": project,
            "selfLink": GCP_IMAGES.format(project=project, name=name)}


@dataclass(frozen=True, slots=True)
class Registered:
    """One resource the program declared: its type token, logical name and inputs."""

    typ: str
    name: str
    inputs: Mapping[str, Any]
    provider: str | None


def computed(typ: str, name: str, inputs: Mapping[str, Any], generation: str = "") -> dict[str, Any]:
    """Outputs a real provider would compute that the programs read back, from the logical
    name (``generation`` tells a replacement apart from the resource it replaced)."""
    host = _host_number(name)
    if typ == "aws:ec2/instance:Instance":
        return {"privateIp": f"10.42.0.{host}", "publicIp": f"203.0.113.{host}"}
    if typ == "aws:ec2/keyPair:KeyPair":
        return {"keyName": f"{inputs.get('keyNamePrefix', '')}{name}{generation}"}
    if typ in ("aws:ec2/placementGroup:PlacementGroup", "aws:ec2/securityGroup:SecurityGroup"):
        return {"name": inputs.get("name") or f"{name}{generation}"}
    if typ == "gcp:compute/instance:Instance":
        interface = dict(inputs["networkInterfaces"][0])
        interface["networkIp"] = f"10.42.0.{host}"
        interface["accessConfigs"] = [{"natIp": f"198.51.100.{host}"}]
        return {"networkInterfaces": [interface]}
    if typ == "gcp:projects/iAMCustomRole:IAMCustomRole":
        return {"name": f"projects/{inputs.get('project', 'my-project')}/roles/{inputs['roleId']}"}
    if typ.startswith("gcp:compute/"):
        return {"selfLink": f"https://compute.googleapis.com/{inputs.get('name', name)}"}
    return {}


def _host_number(name: str) -> int:
    """10 + the node index for ``node-<i>``: addresses stay the same from run to run."""
    index = name.rsplit("-", 1)[-1]
    return 10 + int(index) if index.isdigit() else 9


class ProgramMocks(pulumi.runtime.Mocks):
    """Records resources and invokes; answers invokes from ``invokes`` (token -> result)."""

    def __init__(self, invokes: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.invokes = dict(invokes or {})
        self.resources: list[Registered] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        #: (type token, logical name) -> the resource's ``ignore_changes`` paths.
        self.ignored: dict[tuple[str, str], list[str]] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        inputs = dict(args.inputs)
        self.resources.append(Registered(args.typ, args.name, inputs, args.provider))
        if args.typ.startswith(DYNAMIC_PREFIX):
            serialized = inputs.pop("__provider")
            if isinstance(serialized, dict):  # the pickled provider arrives wrapped as a secret
                serialized = serialized["value"]
            provider = dill.loads(base64.b64decode(serialized))
            result = provider.create(inputs)
            return result.id, dict(result.outs or {})
        outs = {**inputs, **computed(args.typ, args.name, inputs)}
        return f"{args.name}-id", outs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        self.calls.append((args.token, dict(args.args)))
        if args.token == GCP_IMAGE_TOKEN and args.token not in self.invokes:
            return gcp_image(args.args.get("family"), args.args.get("project"))
        return dict(self.invokes.get(args.token, {}))

    def of_type(self, typ: str) -> list[Registered]:
        """Every resource of type token ``typ`` (e.g. ``aws:ec2/instance:Instance``), sorted by
        logical name with numbers compared as numbers (``node-2`` before ``node-10``): the
        engine registers resources as their inputs resolve, in no fixed order."""
        def key(r: Registered) -> list[object]:
            return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", r.name)]

        return sorted((r for r in self.resources if r.typ == typ), key=key)

    def named(self, name: str) -> Registered:
        """The resource with logical name ``name``."""
        found = [r for r in self.resources if r.name == name]
        if len(found) != 1:
            raise KeyError(f"{len(found)} resources named {name!r}")
        return found[0]


class _OptionsMonitor(MockMonitor):
    """The SDK's mock monitor, which also records each resource's ``ignore_changes``."""

    def __init__(self, mocks: ProgramMocks) -> None:
        super().__init__(mocks)
        self.recorder = mocks

    def RegisterResource(self, request: Any) -> Any:
        self.recorder.ignored[(request.type, request.name)] = list(request.ignoreChanges)
        return super().RegisterResource(request)


def run_program(program: Callable[[], None], mocks: ProgramMocks,
                config: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run a stack program against ``mocks`` and return its exports, fully resolved.

    ``config``: the stack's config during the run (``{"skyward:sshCidr": ...}``); none by
    default, and none again afterwards.
    """
    token = CONFIG.set(dict(config or {}))
    try:
        return _run(program, mocks)
    finally:
        CONFIG.reset(token)


#: The loop mocked runs make current when an ``asyncio.run()`` left none: one per process,
#: reused, so that each such run does not leave a loop (and its self-pipe) to the collector.
_loop: asyncio.AbstractEventLoop | None = None


def _current_loop() -> None:
    """Pulumi's test runner needs a current loop; an earlier ``asyncio.run()`` removed it."""
    global _loop
    try:
        asyncio.get_event_loop()
    except RuntimeError:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
        asyncio.set_event_loop(_loop)


def _run(program: Callable[[], None], mocks: ProgramMocks) -> dict[str, Any]:
    _current_loop()
    # A fresh root stack each run: set_mocks keeps the one an earlier run made, whose exports
    # would show through this run's (an export one program makes and another does not).
    pulumi.runtime.settings.ROOT.set(None)
    pulumi.runtime.set_mocks(mocks, preview=False, monitor=_OptionsMonitor(mocks))
    exported: dict[str, Any] = {}

    @pulumi.runtime.test
    def body() -> pulumi.Output[None]:
        program()
        root = pulumi.runtime.get_root_resource()
        outputs = dict(getattr(root, "outputs", {}))
        return pulumi.Output.from_input(outputs).apply(exported.update)

    body()
    return exported
