"""A cloud stack's own program, run with no engine, provider plugin or account: what it declares.

``skyward-iac preview`` and ``plan`` fall back to this where a real ``pulumi preview`` cannot
run (no aws/gcp provider plugin here, or no credentials). The program is the very function a
stack runs (``program_for``), executed under the Pulumi SDK's mock monitor
(``pulumi.runtime.set_mocks``), which records each resource's declared inputs. The Automation
API cannot run it instead: even a preview makes the engine load the provider plugin of every
resource, and that plugin is what is missing.

What the program would ask the cloud while it runs (the newest image of a family, the zones
that offer the type, the default VPC) is answered with a placeholder that says what will be
looked up at apply, built from the question itself: no value here is invented. The stack's own
dynamic resources (SSH and host keys, etcd certificates) run their real providers in memory and
are thrown away. There is no diff: no state to compare with, and the provider's defaults and
checks are not applied.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pulumi

from skyward_iac.infra.programs import ClusterRequest, pins, program_for
from skyward_iac.infra.programs.decisions import StackProgram
from skyward_iac.infra.programs.key_inputs import NODE_TYPES, key_inputs
from skyward_iac.infra.programs.testing import DYNAMIC_PREFIX, ProgramMocks, run_program

#: How every looked-up value starts.
AT_APPLY = "at apply: "
#: Stands for the caller's public /32 when the provider sets no ``ssh_cidr`` (a real stack
#: asks a web service for it when it is created); a documentation address (RFC 5737), since
#: the program checks it is a CIDR, relabelled wherever it appears in what is shown.
CALLER_CIDR = "192.0.2.255/32"
CALLER_LABEL = f"{AT_APPLY}this machine's public address (/32; or set ssh_cidr)"
#: The pins a real stack resolves when it is created (``pins.stack_pins``), offline: what the
#: credentials will say.
OFFLINE_RESOLVERS = pins.Resolvers(
    caller_cidr=lambda: CALLER_CIDR,
    aws_account_id=lambda region: f"{AT_APPLY}the account of the AWS credentials",
    gcp_project=lambda: f"{AT_APPLY}the default project of the GCP credentials "
                        "(or set sky.GCP(project=...))",
)
#: The run's decisions a reviewer reads (the others -- tags, lifetime, maximum -- are the
#: request's own).
SHOWN_DECISIONS = (pins.PLACE, pins.ZONE, pins.IMAGE)


@dataclass(frozen=True, slots=True)
class Declared:
    """One resource the program declared: its type token, logical name and key inputs."""

    type: str
    name: str
    inputs: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class OfflineDeclaration:
    """What a cloud program declared offline, and what its run decided (``decisions.py``:
    ``place``, ``zone``, ``image`` ...), placeholders included."""

    provider: str
    resources: tuple[Declared, ...]
    decisions: Mapping[str, str]

    @property
    def nodes(self) -> tuple[Declared, ...]:
        """The declared instances, node-0 first."""
        return tuple(r for r in self.resources if r.type in NODE_TYPES)


class OfflineMocks(ProgramMocks):
    """``ProgramMocks`` whose cloud look-ups are answered with ``AT_APPLY`` placeholders, and
    whose resource ids say whose id they stand for."""

    def __init__(self, region: str) -> None:
        super().__init__()
        self.region = region

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        resource_id, outputs = super().new_resource(args)
        if args.typ.startswith(DYNAMIC_PREFIX):
            return resource_id, outputs
        return f"{AT_APPLY}the id of {args.name}", outputs

    # The mock monitor takes a plain result too (the stub types only the pair with failures).
    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:  # type: ignore[override]
        self.calls.append((args.token, dict(args.args)))
        return looked_up(args.token, dict(args.args), self.region)


def looked_up(token: str, args: Mapping[str, Any], region: str) -> dict[str, Any]:
    """The placeholder answer to the look-up ``token`` asked with ``args``; ``RuntimeError``
    for one this module does not know (a program change must teach it here)."""
    filters = {f.get("name"): (f.get("values") or [""])[0] for f in args.get("filters") or []}
    if token == "aws:ec2/getAmi:getAmi":
        owners = ", ".join(args.get("owners") or [])
        return {"id": f"{AT_APPLY}the newest AMI named {filters.get('name')!r} of {owners} "
                      f"({filters.get('architecture')})"}
    if token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
        zone = (f"{AT_APPLY}the first zone of {region} that offers "
                f"{filters.get('instance-type')}")
        return {"locations": [zone]}
    if token == "aws:ec2/getVpc:getVpc":
        return {"id": f"{AT_APPLY}the default VPC of {region}"}
    if token == "aws:ec2/getSubnet:getSubnet":
        return {"id": f"{AT_APPLY}the default subnet of the zone"}
    if token == "gcp:compute/getImage:getImage":
        text = (f"{AT_APPLY}the newest image of family {args.get('family')} in project "
                f"{args.get('project')}")
        return {"selfLink": text, "name": text}
    raise RuntimeError(f"the offline preview cannot answer the program's look-up {token} "
                       f"({dict(args)}); it needs the provider")


def declare_offline(request: ClusterRequest) -> OfflineDeclaration:
    """Run ``request``'s stack program under mocks and return what it declared.

    The stack's pins are resolved first, as a real stack's creation does (``ConfigError`` for
    a bad ``ssh_cidr``, before the program runs), the looked-up ones as placeholders. The
    program runs in a thread of its own: the SDK's runtime settings are context variables, which a new
    thread starts without, so the mock monitor never replaces the runtime of a pool this
    process runs, and the program gets an event loop of its own (also under Jupyter's).
    """
    provider = request.spec.provider
    assert request.offer is not None, "plan_pool decides the offer"
    mocks = OfflineMocks(request.offer.region)
    config = pins.config_values(pins.stack_pins(request, OFFLINE_RESOLVERS))
    program = program_for(request)
    with ThreadPoolExecutor(1, thread_name_prefix="skyward-offline") as pool:
        pool.submit(run_program, program, mocks, config).result()
    recorded = program.recorder.values if isinstance(program, StackProgram) and \
        program.recorder is not None else {}
    decisions = {key: relabel(recorded[key]) for key in SHOWN_DECISIONS if key in recorded}
    zone = decisions.get(pins.ZONE)
    resources = [Declared(r.typ, r.name, relabel(key_inputs(r.typ, r.inputs, zone)))
                 for r in mocks.resources]
    return OfflineDeclaration(provider.kind, tuple(sorted(resources, key=_order)), decisions)


def relabel(value: Any) -> Any:
    """``value`` with the caller's stand-in address replaced by what it stands for."""
    if isinstance(value, str):
        return CALLER_LABEL if value == CALLER_CIDR else value
    if isinstance(value, Mapping):
        return {k: relabel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [relabel(v) for v in value]
    return value


def _order(resource: Declared) -> tuple[Any, ...]:
    """By type, then by name with numbers compared as numbers (``node-2`` before ``node-10``):
    the program registers resources as their inputs resolve, in no fixed order."""
    parts = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", resource.name)]
    return (resource.type, [(isinstance(p, str), p) for p in parts])
