"""What to provision: ``Spec``, ``Nodes``, ``Image`` (how to run it, ``Worker`` and ``Options``,
is in ``api/options.py``).

All are frozen pydantic models validated on construction, so bad input fails before anything is
provisioned. ``validated`` (from ``api/model.py``) builds one with every problem in one
``ConfigError``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from skyward_iac.api import metrics as metrics_module
from skyward_iac.api import model
from skyward_iac.api.accelerators import Accelerator
from skyward_iac.api.includes import check_includes
from skyward_iac.api.metrics import MetricSpec
from skyward_iac.api.model import UserModel, shown
from skyward_iac.api.plugin import check_plugins
from skyward_iac.api.providers import AWS, GCP, Local
from skyward_iac.api.volumes import Volume, check_volumes

AllocationStrategy = Literal["spot-if-available", "spot", "on-demand", "cheapest"]
Architecture = Literal["x86_64", "arm64"]


class _Frozen(UserModel):
    pass


#: The most nodes one pool may have (a guard against typos such as ``nodes=10**6``).
MAX_NODES = 1000
#: The longest and shortest ttl: a heartbeat every ttl/3 must be feasible, and a node that
#: outlives its client by more than 30 days is a forgotten one.
MAX_TTL = 30 * 24 * 3600
MIN_TTL = 3


class Nodes(_Frozen):
    """How many nodes: ``desired`` now; ``min``/``max`` for partial readiness and elasticity."""

    positional = ("desired", "max", "min")  # the reference's field order

    desired: int = Field(ge=1, le=MAX_NODES)
    min: int | None = Field(default=None, ge=1, le=MAX_NODES)
    max: int | None = Field(default=None, ge=1, le=MAX_NODES)

    @model_validator(mode="after")
    def _ordered(self) -> Nodes:
        if self.min is not None and self.min > self.desired:
            raise ValueError(f"min ({self.min}) cannot exceed desired ({self.desired})")
        if self.max is not None and self.max < self.desired:
            raise ValueError(f"max ({self.max}) cannot be below desired ({self.desired})")
        return self


#: What ``Spec.nodes`` takes, in every refusal of it.
NODES_ACCEPTED = ("nodes must be an int (nodes=2), a (low, high) tuple of ints for an elastic "
                  "pool (nodes=(2, 8)), or sky.Nodes(desired=..., min=..., max=...)")


class PipIndex(_Frozen):
    """A package index for some packages only: ``packages`` are installed from ``url`` (first),
    their dependencies that index lacks from the default one."""

    url: str
    packages: tuple[str, ...] = Field(min_length=1)

    @field_validator("url")
    @classmethod
    def _index_url(cls, value: str) -> str:
        if not value.startswith(("https://", "http://", "file://")):
            raise ValueError(f"PipIndex.url must be an http(s):// or file:// URL, got {value!r}")
        return value

    @field_validator("packages")
    @classmethod
    def _package_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        _all_match(value, _PACKAGE, "is not a package name (versions go in Image.pip, e.g. "
                                    "'torch==2.5.1')")
        return value


#: A distribution name as PEP 508 spells it (the part before any version or extra).
_PACKAGE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
#: A Debian package name, optionally ``:arch`` and ``=version`` as apt-get takes them.
_APT_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?(=[A-Za-z0-9.+~:-]+)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SkywardSource = Literal["auto", "local", "pypi", "github"]


def _all_match(values: Iterable[str], pattern: re.Pattern[str], problem: str) -> None:
    for value in values:
        if not pattern.fullmatch(value):
            raise ValueError(f"{value!r} {problem}")


class Image(_Frozen):
    """The node's environment, built by the bootstrap: Python (uv), packages, files, variables.

    Every field is described, with an example, in docs/guides/image.md.
    """

    python: str = "auto"
    pip: tuple[str, ...] = ()
    pip_indexes: tuple[PipIndex, ...] = ()
    apt: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    shell_vars: dict[str, str] = Field(default_factory=dict)
    includes: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    skyward_source: SkywardSource = "auto"
    metrics: tuple[MetricSpec, ...] | None = Field(default_factory=metrics_module.Default)
    bootstrap_timeout: int = Field(default=300, gt=0)

    @field_validator("python")
    @classmethod
    def _python_version(cls, value: str) -> str:
        parts = value.split(".")
        if value != "auto" and not (len(parts) == 2 and all(p.isdigit() for p in parts)):
            raise ValueError(f"python must be 'auto' or a version like '3.11', got {value!r}")
        return value

    @field_validator("apt")
    @classmethod
    def _apt_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        _all_match(value, _APT_PACKAGE, "is not a Debian package name (lowercase, e.g. 'ffmpeg' "
                                        "or 'git=1:2.39.5-0+deb12u1')")
        return value

    @field_validator("env", "shell_vars")
    @classmethod
    def _variable_names(cls, value: dict[str, str]) -> dict[str, str]:
        _all_match(value, _ENV_NAME, "is not an environment variable name (letters, digits "
                                     "and _, not starting with a digit)")
        return value

    @field_validator("shell_vars")
    @classmethod
    def _commands(cls, value: dict[str, str]) -> dict[str, str]:
        for name, command in value.items():
            if not command.strip():
                raise ValueError(f"{name}: empty shell command")
        return value

    @field_validator("skyward_source")
    @classmethod
    def _reachable_source(cls, value: str) -> str:
        if value == "github":
            raise ValueError(
                "skyward_source='github' is not available: skyward_iac has no public Git "
                "repository nodes could install from. Use 'auto' or 'local' (ship the client's "
                "installed package) or 'pypi' (install skyward_iac==<client version>)")
        return value

    @field_validator("metrics", mode="before")
    @classmethod
    def _metric_specs(cls, value: object) -> tuple[MetricSpec, ...] | None:
        return metrics_module.resolve(value)

    @model_validator(mode="after")
    def _includes_exist(self) -> Image:
        check_includes(self.includes, self.excludes)
        return self

    @model_validator(mode="after")
    def _one_index_per_package(self) -> Image:
        seen: dict[str, str] = {}
        for index in self.pip_indexes:
            for package in index.packages:
                name = re.sub(r"[-_.]+", "-", package).lower()
                if seen.setdefault(name, index.url) != index.url:
                    raise ValueError(f"pip_indexes: {package!r} is routed to both "
                                     f"{seen[name]} and {index.url}; name it in one index only")
        return self


class Spec(_Frozen):
    """A request for nodes: provider, hardware, count, environment and lifetime."""

    positional = ("provider", "accelerator", "nodes", "vcpus", "memory_gb", "disk_gb",
                  "architecture", "allocation", "image", "region", "max_hourly_cost", "ttl")

    provider: Local | AWS | GCP
    accelerator: Accelerator | None = None
    nodes: Nodes = Field(default_factory=lambda: Nodes(desired=1))
    vcpus: float | None = Field(default=None, gt=0)
    memory_gb: float | None = Field(default=None, gt=0)
    disk_gb: int | None = Field(default=None, gt=0)
    architecture: Architecture | None = None
    allocation: AllocationStrategy = "spot-if-available"
    image: Image = Field(default_factory=Image)
    region: str | None = None
    max_hourly_cost: float | None = Field(default=None, gt=0)
    ttl: int = Field(default=600, ge=0, description="seconds a node outlives a silent client")
    volumes: tuple[Volume, ...] = ()
    #: ``sky.plugins.Plugin`` objects (a list is accepted), applied in order; see
    #: docs/guides/distributed-training.md.
    plugins: tuple[Any, ...] = ()

    @field_validator("plugins", mode="before")
    @classmethod
    def _plugins(cls, value: Any) -> Any:
        return check_plugins(value)

    @field_validator("provider", mode="before")
    @classmethod
    def _provider_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(
                f"provider must be an object such as sky.Local() or sky.AWS(), not the string "
                f"{value!r}"
            )
        return value

    @field_validator("accelerator", mode="before")
    @classmethod
    def _accelerator_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(
                f"accelerator must be an object such as sky.accelerators.{value}(), not the "
                f"string {value!r} (strings are accepted only in skyward.toml)"
            )
        return value

    @field_validator("nodes", mode="before")
    @classmethod
    def _node_spec(cls, value: Any) -> Any:
        if isinstance(value, (Nodes, dict)):
            return value  # a dict: from skyward.toml, validated as Nodes
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 1:
                raise ValueError(f"nodes must be at least 1, got {value}")
            return {"desired": value}
        if (isinstance(value, (tuple, list)) and len(value) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
            return {"desired": value[0], "max": value[1]}
        raise ValueError(f"{NODES_ACCEPTED}; got {shown(value)}")

    @model_validator(mode="after")
    def _volumes_mountable(self) -> Spec:
        check_volumes(self.volumes, self.provider.kind)
        return self

    @model_validator(mode="after")
    def _provider_serves_it(self) -> Spec:
        self.provider.check_pool(self)  # what only one provider refuses, it says itself
        return self

    @field_validator("ttl", mode="before")
    @classmethod
    def _ttl(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0:
                raise ValueError(f"ttl must be >= 0 seconds (0 disables the dead-man switch), "
                                 f"got {value}")
            if 0 < value < MIN_TTL:
                raise ValueError(f"ttl must be at least {MIN_TTL} seconds (the client beats every "
                                 f"ttl/3 seconds) or 0 to disable it, got {value}")
            if value > MAX_TTL:
                raise ValueError(f"ttl must be at most {MAX_TTL} seconds (30 days), got {value}; "
                                 "use 0 to disable the dead-man switch")
        return value

#: Callers import it from here, where it lived before ``api/model.py``.
validated = model.validated
