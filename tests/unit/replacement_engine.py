"""A model of the engine's updates for the replacement oracle (test_replacement_oracle.py).

``ModelStack`` carries one stack's config and resource state from one program run to the next.
Each run executes the real AWS or GCP program under Pulumi mocks; every declared resource that
already exists is diffed against its stored state as the engine and provider would: its
``ignore_changes`` first, then the provider's own rules (``programs/replacement.py``), and for
the stack's dynamic resources (credentials, host keys, etcd certificates) their provider's own
``diff``. A resource kept gets its old id and outputs back, so later inputs that reference it (a
subnet id, a host key inside user data) stay what a real stack would see; a replaced one gets new
ones. The model stores what a successful run decided (``StackProgram.unstored``), as
``ClusterStack`` does, and a node whose launch the cloud refused is never stored.

What a real provider keeps that the declaration does not say is modelled where it matters: a
GCP boot disk stores the URL of the image it was made from, the newest of a family at creation.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dill  # type: ignore[import-untyped]
import pulumi

from skyward_iac.infra.programs import pins, replacement
from skyward_iac.infra.programs.testing import (
    AWS_INVOKES,
    DYNAMIC_PREFIX,
    GCP_IMAGE_TOKEN,
    ProgramMocks,
    computed,
    gcp_image,
    run_program,
)

INSTANCES = ("aws:ec2/instance:Instance", "gcp:compute/instance:Instance")
PROVIDER_PREFIX = "pulumi:providers:"
#: Provider inputs every resource picks up as tags or labels, updated in place.
PROVIDER_DEFAULTS = ("defaultTags", "defaultLabels")
FAMILY = "/global/images/family/"


@dataclass
class Images:
    """The images the clouds publish: ``publish()`` makes a newer one the newest."""

    version: int = 1

    def publish(self) -> None:
        self.version += 1

    def ami(self) -> str:
        return f"ami-0000000{self.version}"

    def gcp(self, family: str | None, project: str | None) -> dict[str, Any]:
        return gcp_image(family, project, version=f"v2026010{self.version}")

    def resolve(self, declared: str) -> str:
        """The image URL a GCP boot disk stores for ``declared`` (a family: its newest)."""
        if FAMILY not in declared:
            return declared
        project = declared.split("projects/", 1)[1].split("/", 1)[0]
        return str(self.gcp(declared.rsplit("/", 1)[-1], project)["selfLink"])


@dataclass
class Stored:
    """One resource in the stack's state."""

    typ: str
    name: str
    id: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    generation: int = 0
    provider: Any = None  # a dynamic resource's unpickled provider


@dataclass(frozen=True)
class Outcome:
    """What an update did to one declared resource: create, same, update, replace, stop, or
    hidden (kept only because ``ignore_changes`` hides what the program now declares)."""

    op: str
    paths: tuple[str, ...] = ()


@dataclass
class Result:
    """One update: per declared resource its outcome, the resources it deleted, and whether it
    succeeded (no node refused)."""

    outcomes: dict[tuple[str, str], Outcome]
    deleted: list[tuple[str, str]]
    succeeded: bool
    declared: dict[tuple[str, str], dict[str, Any]]


class EngineMocks(ProgramMocks):
    """Mocks that diff each declared resource against the prior state (see module doc)."""

    def __init__(self, prior: Mapping[tuple[str, str], Stored], images: Images,
                 invokes: Mapping[str, Mapping[str, Any]]) -> None:
        super().__init__(invokes)
        self.prior = prior
        self.images = images
        self.outcomes: dict[tuple[str, str], Outcome] = {}
        self.stored: dict[tuple[str, str], Stored] = {}

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        self.calls.append((args.token, dict(args.args)))
        if args.token == "aws:ec2/getAmi:getAmi":
            return {"id": self.images.ami()}
        if args.token == GCP_IMAGE_TOKEN:
            return self.images.gcp(args.args.get("family"), args.args.get("project"))
        if args.token == "aws:ec2/getSubnet:getSubnet":  # the default VPC's subnet of a zone
            return {"id": f"subnet-{args.args.get('availabilityZone')}"}
        return dict(self.invokes.get(args.token, {}))

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        key = (args.typ, args.name)
        inputs = dict(args.inputs)
        provider = None
        if args.typ.startswith(DYNAMIC_PREFIX):
            serialized = inputs.pop("__provider")
            if isinstance(serialized, dict):
                serialized = serialized["value"]
            provider = dill.loads(base64.b64decode(serialized))
        self.resources.append(_registered(args, inputs))
        prior = self.prior.get(key)
        if prior is not None:
            effective = replacement.without_ignored(prior.inputs, inputs,
                                                    self.ignored.get(key, []))
            outcome = self._diff(prior, effective, inputs, provider)
            self.outcomes[key] = outcome
            if outcome.op != "replace":
                return self._keep(prior, effective, outcome)
        else:
            self.outcomes[key] = Outcome("create")
        return self._create(args.typ, args.name, inputs, provider,
                            prior.generation + 1 if prior else 0)

    def _diff(self, prior: Stored, inputs: dict[str, Any], declared: dict[str, Any],
              provider: Any) -> Outcome:
        """``inputs``: ``declared`` after ``ignore_changes``."""
        if prior.typ.startswith(DYNAMIC_PREFIX):
            replaces = provider.diff(prior.id, prior.outputs, inputs).replaces or []
            return Outcome("replace", tuple(replaces)) if replaces else Outcome("same")
        if prior.typ.startswith(PROVIDER_PREFIX):
            # Provider settings other than default tags are not in the table: any change
            # counts as replacing every resource of the provider.
            moved = tuple(k for k in set(prior.inputs) | set(inputs) if k not in
                          PROVIDER_DEFAULTS and prior.inputs.get(k) != inputs.get(k))
            return Outcome("replace", moved) if moved else Outcome("same")
        found = replacement.changes(prior.typ, prior.inputs, inputs)
        if found.replace:
            return Outcome("replace", found.replace)
        if found.stops:
            return Outcome("stop", found.stops)
        hidden = replacement.changes(prior.typ, prior.inputs, declared)
        if hidden:  # the engine keeps it, but the program declares another resource
            return Outcome("hidden", hidden.replace + hidden.stops)
        return Outcome("same" if prior.inputs == inputs else "update")

    def _keep(self, prior: Stored, inputs: dict[str, Any], outcome: Outcome
              ) -> tuple[str, dict[str, Any]]:
        stored = inputs if prior.provider is None else prior.inputs
        if prior.typ == INSTANCES[1]:
            # The disk keeps the image it was made from; only a replacement changes it.
            stored = _with_image(inputs, _boot_image(prior.inputs))
        outputs = prior.outputs if prior.typ.startswith(DYNAMIC_PREFIX) else {
            **inputs, **computed(prior.typ, prior.name, inputs, _suffix(prior.generation))}
        self.stored[(prior.typ, prior.name)] = Stored(
            prior.typ, prior.name, prior.id, stored, outputs, prior.generation, prior.provider)
        return prior.id, outputs

    def _create(self, typ: str, name: str, inputs: dict[str, Any], provider: Any,
                generation: int) -> tuple[str, dict[str, Any]]:
        if provider is not None:
            result = provider.create(inputs)
            outputs, id_ = dict(result.outs or {}), str(result.id)
        else:
            outputs = {**inputs, **computed(typ, name, inputs, _suffix(generation))}
            id_ = f"{name}-id{_suffix(generation)}"
        self.stored[(typ, name)] = Stored(typ, name, id_, self._as_stored(typ, inputs), outputs,
                                          generation, provider)
        return id_, outputs

    def _as_stored(self, typ: str, inputs: dict[str, Any]) -> dict[str, Any]:
        """``inputs`` as the provider stores them (a GCP boot disk: the image URL)."""
        if typ != INSTANCES[1] or not _boot_image(inputs):
            return inputs
        return _with_image(inputs, self.images.resolve(str(_boot_image(inputs))))


def _registered(args: pulumi.runtime.MockResourceArgs, inputs: dict[str, Any]) -> Any:
    from skyward_iac.infra.programs.testing import Registered

    return Registered(args.typ, args.name, inputs, args.provider)


def _suffix(generation: int) -> str:
    return f"-r{generation}" if generation else ""


def _boot_image(inputs: Mapping[str, Any]) -> Any:
    return ((inputs.get("bootDisk") or {}).get("initializeParams") or {}).get("image")


def _with_image(inputs: Mapping[str, Any], image: Any) -> dict[str, Any]:
    result = replacement.without_ignored({}, inputs, [])
    result.setdefault("bootDisk", {}).setdefault("initializeParams", {})["image"] = image
    return result


@dataclass
class ModelStack:
    """One stack: its config (pins) and state, updated by ``up`` like the engine would."""

    make_program: Callable[[Any], Callable[[], None]]
    images: Images = field(default_factory=Images)
    config: dict[str, str] = field(default_factory=dict)
    state: dict[tuple[str, str], Stored] = field(default_factory=dict)
    invokes: dict[str, Any] = field(default_factory=lambda: dict(AWS_INVOKES))

    def up(self, request: Any, refused: Iterable[int] = ()) -> Result:
        """Run the program for ``request``; the nodes in ``refused`` fail to launch (capacity),
        which fails the update: nothing it decided is stored."""
        program, mocks = self._run(request)
        refused_keys = {(typ, f"node-{i}") for i in refused for typ in INSTANCES}
        # What waits for a refused instance's outputs (a GCP node's IAM binding,
        # ``node-<i>-...``) is never created either; its host key (dynamic) was made first.
        waiting = {(typ, name) for typ, name in mocks.stored for i in refused
                   if name.startswith(f"node-{i}-") and not typ.startswith(DYNAMIC_PREFIX)}
        new_state = {key: stored for key, stored in mocks.stored.items()
                     if key not in refused_keys | waiting or key in self.state}
        deleted = [key for key in self.state if key not in mocks.stored]
        succeeded = not (refused_keys & set(mocks.stored))
        self.state = new_state
        if succeeded:
            self._store_decisions(program)
        declared = {(r.typ, r.name): dict(r.inputs) for r in mocks.resources}
        return Result(mocks.outcomes, deleted, succeeded, declared)

    def preview(self, request: Any) -> dict[tuple[str, str], dict[str, Any]]:
        """A preview: the declared inputs; the state is untouched, the decisions stored."""
        program, mocks = self._run(request)
        self._store_decisions(program)
        return {(r.typ, r.name): dict(r.inputs) for r in mocks.resources}

    def _run(self, request: Any) -> tuple[Any, EngineMocks]:
        program = self.make_program(request)
        mocks = EngineMocks(self.state, self.images, self.invokes)
        run_program(program, mocks, self.config)
        return program, mocks

    def _store_decisions(self, program: Any) -> None:
        unstored = getattr(program, "unstored", None)
        if unstored is not None:
            self.config.update(pins.config_values(unstored()))

    def node_images(self) -> dict[str, Any]:
        """Each node's boot image as stored (AMI id, GCP image URL)."""
        images = {}
        for (typ, name), stored in sorted(self.state.items()):
            if typ in INSTANCES:
                images[name] = stored.inputs.get("ami") or _boot_image(stored.inputs)
        return images

    def running_nodes(self) -> list[str]:
        return sorted(name for typ, name in self.state if typ in INSTANCES)
