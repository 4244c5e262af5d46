"""Accelerator requests: ``sky.accelerators.A100()``, ``sky.accelerators.H100(count=8)``, ..."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Accelerator(BaseModel):
    """One kind of accelerator and how many of it each node needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    count: float = Field(default=1, gt=0)
    memory: str | None = None
    form_factor: str | None = None


def _factory(name: str, default_memory: str | None = None, doc: str = ""):  # type: ignore[no-untyped-def]
    def make(
        *, count: float = 1, memory: str | None = None, form_factor: str | None = None
    ) -> Accelerator:
        return Accelerator(
            name=name, count=count, memory=memory or default_memory, form_factor=form_factor
        )

    make.__name__ = make.__qualname__ = name
    make.__doc__ = doc or f"{name} accelerator(s) per node."
    return make


H100 = _factory("H100", "80GB")
H200 = _factory("H200", "141GB")
B200 = _factory("B200", "192GB")
A100 = _factory("A100", "80GB", "A100, 80GB by default; ``memory='40GB'`` for the smaller one.")
A10G = _factory("A10G", "24GB")
A40 = _factory("A40", "48GB")
L4 = _factory("L4", "24GB")
L40S = _factory("L40S", "48GB")
T4 = _factory("T4", "16GB")
V100 = _factory("V100", "16GB")
RTX_4090 = _factory("RTX_4090", "24GB")
RTX_A6000 = _factory("RTX_A6000", "48GB")
MI300X = _factory("MI300X", "192GB")


def Custom(name: str, *, memory: str | None = None, count: float = 1) -> Accelerator:  # noqa: N802
    """An accelerator by its provider's own name."""
    return Accelerator(name=name, memory=memory, count=count)


__all__ = [
    "Accelerator", "A100", "A10G", "A40", "B200", "Custom", "H100", "H200", "L4", "L40S",
    "MI300X", "RTX_4090", "RTX_A6000", "T4", "V100",
]
