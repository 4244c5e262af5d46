"""Whether this machine can give what a Local ``Spec`` asks for.

A Local node is processes on this machine, so its only "offer" is the machine itself. A spec
it cannot honour (``vcpus=1000`` on a laptop, more memory than it has, an ``arm64`` node on an
x86_64 machine) is refused like a cloud spec no offer matches -- a ``ConfigError`` before
anything is provisioned -- instead of running on less than it asked for, which would make a
Local test of a pool say nothing about the code's real needs. Local nodes share the machine,
so each node's request is compared with the whole machine, not divided among them.
Accelerators are refused by ``Spec`` itself.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.spec import Spec

#: ``platform.machine()`` spellings -> ``Spec.architecture`` names.
_ARCHITECTURES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True, slots=True)
class Machine:
    """What this machine offers a Local node."""

    vcpus: int
    memory_gb: float
    architecture: str


def this_machine() -> Machine:
    """The CPUs this process may run on, the physical memory, and the architecture."""
    try:
        vcpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        vcpus = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory = float("inf")  # unknown here: not a reason to refuse
    machine = platform.machine().lower()
    return Machine(vcpus, memory, _ARCHITECTURES.get(machine, machine))


def shortfalls(spec: Spec, machine: Machine) -> list[str]:
    """What ``spec`` asks of each node that ``machine`` does not have (empty: it fits)."""
    short = []
    if spec.vcpus is not None and spec.vcpus > machine.vcpus:
        short.append(f"vcpus={spec.vcpus:g} (this machine has {machine.vcpus})")
    if spec.memory_gb is not None and spec.memory_gb > machine.memory_gb:
        short.append(f"memory_gb={spec.memory_gb:g} (this machine has "
                     f"{machine.memory_gb:.1f} GB)")
    if spec.architecture is not None and spec.architecture != machine.architecture:
        short.append(f"architecture={spec.architecture!r} (this machine is "
                     f"{machine.architecture})")
    return short


def check_local_fits(spec: Spec, machine: Machine | None = None) -> None:
    """Refuse a Local ``spec`` this machine cannot give, naming each shortfall."""
    short = shortfalls(spec, machine or this_machine())
    if short:
        raise ConfigError(
            f"a Local node runs on this machine, which cannot give {', '.join(short)}. Ask for "
            "no more than it has (or leave the field out), or use sky.AWS()/sky.GCP() for a "
            "bigger node (a list of Specs falls back from one to the next)")
