"""Accelerator requests: ``sky.accelerators.A100()``, ``sky.accelerators.H100(count=8)``, ...

Every factory is keyword-only and takes ``count``; ``memory`` and ``form_factor`` exist only on
the accelerators that come in several sizes or packages, and a value the accelerator does not
come in fails at once with the valid choices. The first memory size listed is the default, so
``A100()`` is the 80GB part and ``A100(memory="40GB")`` the smaller one.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.model import UserModel

Vendor = Literal["nvidia", "amd", "aws", "google", "intel", "other"]


class Accelerator(UserModel):
    """One kind of accelerator and how many of it each node needs."""

    positional = ("name",)

    name: str
    count: float = Field(default=1, gt=0)
    memory: str | None = None
    form_factor: str | None = None

    @property
    def memory_gb(self) -> float | None:
        """``memory`` as a number of GB (``"80GB"`` -> 80.0), or None when unspecified."""
        return parse_memory_gb(self.memory) if self.memory else None


@dataclass(frozen=True, slots=True)
class AcceleratorInfo:
    """What is known about one accelerator name: vendor, memory sizes and packages."""

    name: str
    vendor: Vendor
    memory: tuple[str, ...]
    form_factors: tuple[str, ...] = ()

    @property
    def default_memory(self) -> str | None:
        """The size ``memory`` defaults to (the first listed)."""
        return self.memory[0] if self.memory else None


_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GB|GIB|G)?\s*$", re.IGNORECASE)


def parse_memory_gb(memory: str) -> float:
    """``"80GB"``, ``"80 GB"``, ``"80gb"`` or ``"80"`` -> 80.0."""
    match = _MEMORY.match(memory)
    if not match:
        raise ConfigError(f"accelerator memory must look like '80GB', got {memory!r}")
    return float(match.group(1))


def _normalize_memory(memory: str) -> str:
    gb = parse_memory_gb(memory)
    return f"{gb:g}GB"


KNOWN: dict[str, AcceleratorInfo] = {}


def _define(
    name: str, vendor: Vendor, memory: tuple[str, ...], form_factors: tuple[str, ...] = (),
) -> Callable[..., Accelerator]:
    info = AcceleratorInfo(name, vendor, memory, form_factors)
    KNOWN[name] = info

    def make(
        *, count: float = 1, memory: str | None = None, form_factor: str | None = None
    ) -> Accelerator:
        return Accelerator(
            name=name, count=count, memory=_check_memory(info, memory),
            form_factor=_check_form_factor(info, form_factor),
        )

    # The runtime signature shows only the options this accelerator really has.
    params = [inspect.Parameter("count", inspect.Parameter.KEYWORD_ONLY, default=1,
                                annotation="float")]
    if len(memory) > 1:
        params.append(inspect.Parameter("memory", inspect.Parameter.KEYWORD_ONLY,
                                        default=memory[0], annotation="str"))
    if form_factors:
        params.append(inspect.Parameter("form_factor", inspect.Parameter.KEYWORD_ONLY,
                                        default=None, annotation="str | None"))
    signature = inspect.Signature(params, return_annotation="Accelerator")
    make.__signature__ = signature  # type: ignore[attr-defined]
    make.__name__ = make.__qualname__ = name
    sizes = f"; memory: {', '.join(memory)}" if len(memory) > 1 else f" ({memory[0]})"
    packages = f"; form_factor: {', '.join(form_factors)}" if form_factors else ""
    make.__doc__ = f"{name} accelerator(s) per node{sizes}{packages}."
    return make


def _check_memory(info: AcceleratorInfo, memory: str | None) -> str | None:
    if memory is None:
        return info.default_memory
    wanted = _normalize_memory(memory)
    if wanted not in info.memory:
        choices = ", ".join(repr(m) for m in info.memory) or "none"
        raise ConfigError(
            f"{info.name} comes with memory {choices}, not {memory!r}; pick one of those or use "
            f"sky.accelerators.Custom({info.name!r}, memory={memory!r})"
        )
    return wanted


def _check_form_factor(info: AcceleratorInfo, form_factor: str | None) -> str | None:
    if form_factor is None:
        return None
    by_upper = {f.upper(): f for f in info.form_factors}
    if form_factor.upper() not in by_upper:
        if not info.form_factors:
            raise ConfigError(f"{info.name} has no form_factor option; leave it out")
        choices = ", ".join(repr(f) for f in info.form_factors)
        raise ConfigError(f"{info.name} form_factor must be one of {choices}, got {form_factor!r}")
    return by_upper[form_factor.upper()]


# NVIDIA data-centre GPUs
B200 = _define("B200", "nvidia", ("180GB", "192GB"))  # HGX B200 (AWS p6, GCP a4) exposes 180GB
B100 = _define("B100", "nvidia", ("192GB",))
GB200 = _define("GB200", "nvidia", ("192GB",))
H200 = _define("H200", "nvidia", ("141GB",), ("SXM", "NVL"))
H100 = _define("H100", "nvidia", ("80GB", "94GB"), ("SXM", "PCIe", "NVL"))
GH200 = _define("GH200", "nvidia", ("96GB", "144GB"))
A100 = _define("A100", "nvidia", ("80GB", "40GB"), ("SXM", "PCIe"))
A40 = _define("A40", "nvidia", ("48GB",))
A30 = _define("A30", "nvidia", ("24GB",))
A10 = _define("A10", "nvidia", ("24GB",))
A10G = _define("A10G", "nvidia", ("24GB",))
L40S = _define("L40S", "nvidia", ("48GB",))
L40 = _define("L40", "nvidia", ("48GB",))
L4 = _define("L4", "nvidia", ("24GB",))
T4 = _define("T4", "nvidia", ("16GB",))
T4G = _define("T4G", "nvidia", ("16GB",))
V100 = _define("V100", "nvidia", ("16GB", "32GB"), ("SXM", "PCIe"))
P100 = _define("P100", "nvidia", ("16GB", "12GB"))
P4 = _define("P4", "nvidia", ("8GB",))
K80 = _define("K80", "nvidia", ("12GB",))
# NVIDIA workstation and consumer GPUs
RTX_PRO_6000 = _define("RTX_PRO_6000", "nvidia", ("96GB",))
RTX_6000_ADA = _define("RTX_6000_ADA", "nvidia", ("48GB",))
RTX_A6000 = _define("RTX_A6000", "nvidia", ("48GB",))
RTX_A5000 = _define("RTX_A5000", "nvidia", ("24GB",))
RTX_A4000 = _define("RTX_A4000", "nvidia", ("16GB",))
RTX_5090 = _define("RTX_5090", "nvidia", ("32GB",))
RTX_4090 = _define("RTX_4090", "nvidia", ("24GB",))
RTX_4080 = _define("RTX_4080", "nvidia", ("16GB",))
RTX_3090 = _define("RTX_3090", "nvidia", ("24GB",))
RTX_3080 = _define("RTX_3080", "nvidia", ("10GB", "12GB"))
# AMD Instinct
MI325X = _define("MI325X", "amd", ("256GB",))
MI300X = _define("MI300X", "amd", ("192GB",))
MI250X = _define("MI250X", "amd", ("128GB",))
MI250 = _define("MI250", "amd", ("128GB",))
MI210 = _define("MI210", "amd", ("64GB",))
MI100 = _define("MI100", "amd", ("32GB",))
# AWS silicon (Neuron SDK)
Trainium = _define("Trainium", "aws", ("32GB",))
Trainium2 = _define("Trainium2", "aws", ("96GB",))
Inferentia = _define("Inferentia", "aws", ("8GB",))
Inferentia2 = _define("Inferentia2", "aws", ("32GB",))
# Intel Gaudi
Gaudi = _define("Gaudi", "intel", ("32GB",))
Gaudi2 = _define("Gaudi2", "intel", ("96GB",))
Gaudi3 = _define("Gaudi3", "intel", ("128GB",))
# Google TPUs (memory per chip)
TPU_V2 = _define("TPU_V2", "google", ("8GB",))
TPU_V3 = _define("TPU_V3", "google", ("16GB",))
TPU_V4 = _define("TPU_V4", "google", ("32GB",))
TPU_V5E = _define("TPU_V5E", "google", ("16GB",))
TPU_V5P = _define("TPU_V5P", "google", ("95GB",))
TPU_V6E = _define("TPU_V6E", "google", ("32GB",))


def Custom(  # noqa: N802 - a factory named like the others
    name: str, *, memory: str | None = None, count: float = 1, form_factor: str | None = None,
) -> Accelerator:
    """An accelerator by its provider's own name; nothing about it is checked."""
    return Accelerator(
        name=name, count=count, memory=_normalize_memory(memory) if memory else None,
        form_factor=form_factor,
    )


def vendor_of(name: str) -> Vendor:
    """The vendor of a known accelerator name (case-insensitive), ``"other"`` otherwise."""
    info = KNOWN.get(name) or next(
        (i for key, i in KNOWN.items() if key.lower() == name.lower()), None
    )
    return info.vendor if info else "other"


__all__ = ["Accelerator", "AcceleratorInfo", "Custom", "KNOWN", "parse_memory_gb", "vendor_of",
           *KNOWN]
