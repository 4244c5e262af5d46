"""``sky.metrics``: what each node measures, and the node-side sampler that measures it.

Configure on the image; every metric is sampled at its own ``interval`` (seconds)::

    sky.Image(metrics=[sky.metrics.CPU(interval=1.0), sky.metrics.GPU(), sky.metrics.Disk("/data")])
    sky.Image(metrics=sky.metrics.Default())   # the default set
    sky.Image(metrics=None)                    # no metrics

Sources: ``/proc/stat``, ``/proc/meminfo``, ``/proc/net/dev``, ``os.statvfs`` and, for the
GPU metrics, one ``nvidia-smi`` query per tick (a node without it reports no GPU metric and no
error). ``Custom`` runs a shell command and reads a number from the last line it prints.

Units: ``%`` (0-100), ``B`` (bytes), ``B/s``, ``C``. GPU samples carry ``device``. The node
side (reading the sources on a schedule) is ``node/sampler.py``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from skyward_iac.api.errors import ConfigError


class MetricSpec:
    """Base of every ``sky.metrics`` object: a named measurement taken every ``interval`` s."""

    __slots__ = ()
    _NAME: ClassVar[str] = ""
    _UNIT: ClassVar[str] = ""
    interval: float

    @property
    def name(self) -> str:
        """What samples of it are called: ``cpu``, ``gpu_memory``, ``disk:/data`` ..."""
        return self._NAME

    @property
    def unit(self) -> str:
        """``%``, ``B``, ``B/s``, ``C``, or a Custom metric's own."""
        return self._UNIT

    def _check(self) -> None:
        if isinstance(self.interval, bool) or not isinstance(self.interval, int | float) \
                or self.interval <= 0:
            raise ConfigError(f"{type(self).__name__}.interval must be a number of seconds > 0, "
                              f"got {self.interval!r}")


@dataclass(frozen=True, slots=True)
class CPU(MetricSpec):
    """CPU utilisation of the whole node, in %."""

    interval: float = 1.0
    _NAME: ClassVar[str] = "cpu"
    _UNIT: ClassVar[str] = "%"

    def __post_init__(self) -> None:
        self._check()


@dataclass(frozen=True, slots=True)
class Memory(MetricSpec):
    """Memory in use (total minus available), in % of the total."""

    interval: float = 2.0
    _NAME: ClassVar[str] = "memory"
    _UNIT: ClassVar[str] = "%"

    def __post_init__(self) -> None:
        self._check()


@dataclass(frozen=True, slots=True)
class MemoryUsed(MetricSpec):
    """Memory in use (total minus available), in bytes."""

    interval: float = 2.0
    _NAME: ClassVar[str] = "memory_used"
    _UNIT: ClassVar[str] = "B"

    def __post_init__(self) -> None:
        self._check()


@dataclass(frozen=True, slots=True)
class MemoryTotal(MetricSpec):
    """Total memory, in bytes."""

    interval: float = 60.0
    _NAME: ClassVar[str] = "memory_total"
    _UNIT: ClassVar[str] = "B"

    def __post_init__(self) -> None:
        self._check()


@dataclass(frozen=True, slots=True)
class GPU(MetricSpec):
    """Utilisation of each GPU, in % (one sample per device)."""

    interval: float = 2.0
    _NAME: ClassVar[str] = "gpu"
    _UNIT: ClassVar[str] = "%"

    def __post_init__(self) -> None:
        self._check()


@dataclass(frozen=True, slots=True)
class GPUMemory(MetricSpec):
    """Memory in use on each GPU, in bytes."""

    interval: float = 2.0
    _NAME: ClassVar[str] = "gpu_memory"
    _UNIT: ClassVar[str] = "B"

    def __post_init__(self) -> None:
        self._check()


@dataclass(frozen=True, slots=True)
class GPUMemoryTotal(MetricSpec):
    """Memory of each GPU, in bytes."""

    interval: float = 60.0
    _NAME: ClassVar[str] = "gpu_memory_total"
    _UNIT: ClassVar[str] = "B"

    def __post_init__(self) -> None:
        self._check()


@dataclass(frozen=True, slots=True)
class GPUTemp(MetricSpec):
    """Temperature of each GPU, in degrees Celsius."""

    interval: float = 5.0
    _NAME: ClassVar[str] = "gpu_temp"
    _UNIT: ClassVar[str] = "C"

    def __post_init__(self) -> None:
        self._check()


@dataclass(frozen=True, slots=True)
class Disk(MetricSpec):
    """Space in use on the filesystem holding ``path``, in % (as ``df`` counts it).

    Named ``disk`` for ``/`` and ``disk:<path>`` otherwise, so several can be watched.
    """

    path: str = "/"
    interval: float = 10.0
    _UNIT: ClassVar[str] = "%"

    def __post_init__(self) -> None:
        self._check()
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise ConfigError(f"Disk.path must be an absolute path, got {self.path!r}")

    @property
    def name(self) -> str:
        return "disk" if self.path == "/" else f"disk:{self.path}"


@dataclass(frozen=True, slots=True)
class NetworkRx(MetricSpec):
    """Bytes received per second on every interface but loopback."""

    interval: float = 1.0
    _NAME: ClassVar[str] = "network_rx"
    _UNIT: ClassVar[str] = "B/s"

    def __post_init__(self) -> None:
        self._check()


@dataclass(frozen=True, slots=True)
class NetworkTx(MetricSpec):
    """Bytes sent per second on every interface but loopback."""

    interval: float = 1.0
    _NAME: ClassVar[str] = "network_tx"
    _UNIT: ClassVar[str] = "B/s"

    def __post_init__(self) -> None:
        self._check()


@dataclass(frozen=True, slots=True)
class Custom(MetricSpec):
    """``command`` run by ``/bin/sh`` on the node; the last line it prints is the value.

    ``Custom("queue_depth", "redis-cli llen jobs", interval=5, unit="jobs")``. A command that
    fails or prints no number gives no sample (and one warning in the node's log).
    """

    # field(): without it the dataclass would take the base class's ``name`` property as a default.
    name: str = field()
    command: str = field()
    interval: float = 3.0
    unit: str = ""
    timeout: float = 10.0

    def __post_init__(self) -> None:
        self._check()
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"Custom metric needs a name, got {self.name!r}")
        if not isinstance(self.command, str) or not self.command.strip():
            raise ConfigError(f"Custom metric {self.name!r} needs a shell command")


def Default(*, interval: float | None = None) -> tuple[MetricSpec, ...]:  # noqa: N802
    """The default set: CPU, memory, GPU, disk and network (``interval`` overrides them all)."""
    specs: tuple[MetricSpec, ...] = (
        CPU(), Memory(), MemoryUsed(), MemoryTotal(), GPU(), GPUMemory(), GPUMemoryTotal(),
        GPUTemp(), Disk(), NetworkRx(), NetworkTx(),
    )
    if interval is None:
        return specs
    return tuple(_with_interval(spec, interval) for spec in specs)


def _with_interval(spec: MetricSpec, interval: float) -> MetricSpec:
    return dataclasses.replace(spec, interval=interval)  # type: ignore[type-var]


def resolve(value: object) -> tuple[MetricSpec, ...] | None:
    """``Image.metrics`` as given -> a tuple of specs, or None when metrics are off.

    Accepts None, one spec, or an iterable of specs (``Default()`` is a tuple).
    """
    if value is None:
        return None
    if isinstance(value, MetricSpec):
        return (value,)
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigError(f"metrics must be None, a sky.metrics object or a list of them, "
                          f"got {value!r}")
    specs = tuple(value)
    for spec in specs:
        if not isinstance(spec, MetricSpec):
            raise ConfigError(f"metrics must hold sky.metrics objects such as "
                              f"sky.metrics.CPU(), got {spec!r}")
    names = [spec.name for spec in specs]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"metrics are named twice: {', '.join(duplicates)}; keep one of each")
    return specs


#: Every spec class by name, for ``to_json``/``from_json`` (the agent's ``--metrics`` flag).
_SPEC_TYPES: dict[str, type[MetricSpec]] = {
    cls.__name__: cls for cls in (CPU, Memory, MemoryUsed, MemoryTotal, GPU, GPUMemory,
                                  GPUMemoryTotal, GPUTemp, Disk, NetworkRx, NetworkTx, Custom)
}


def to_json(specs: Iterable[MetricSpec]) -> str:
    """Specs as JSON (``[{"type": "CPU", "interval": 1.0}, ...]``): readable in ``ps`` and a
    node's log, and never unpickled by the agent."""
    import dataclasses
    import json

    return json.dumps([{"type": type(spec).__name__, **dataclasses.asdict(spec)}  # type: ignore[call-overload]
                       for spec in specs], separators=(",", ":"))


def from_json(text: str) -> tuple[MetricSpec, ...]:
    """The specs ``to_json`` wrote; ``ConfigError`` names an unknown type or a bad field."""
    specs = []
    for item in json.loads(text):
        fields = dict(item)
        kind = _SPEC_TYPES.get(fields.pop("type", ""))
        if kind is None:
            raise ConfigError(f"unknown metric type in {item!r}")
        try:
            specs.append(kind(**fields))
        except TypeError as exc:
            raise ConfigError(f"bad metric {item!r}: {exc}") from exc
    return tuple(specs)
