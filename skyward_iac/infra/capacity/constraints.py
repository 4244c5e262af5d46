"""The constraints offers are filtered by (``offers.matching``): each says what it requires and,
when it leaves no offer, what the offers left before it have instead."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from skyward_iac.api.accelerators import Accelerator

if TYPE_CHECKING:
    from skyward_iac.api.spec import Spec
    from skyward_iac.infra.capacity.offers import Offer

Hint = Callable[[list["Offer"]], str]


@dataclass(frozen=True, slots=True)
class Constraint:
    """One requirement on offers: what it is, whether an offer meets it, and a hint of what the
    offers left before it have instead (for the refusal)."""

    describe: str
    keep: Callable[[Offer], bool]
    hint: Hint


def offered(label: str, values: Callable[[Offer], Iterable[str | None]]) -> Hint:
    """A hint listing what the offers left before a constraint have instead."""

    def hint(left: list[Offer]) -> str:
        found = sorted({v for o in left for v in values(o) if v})
        return f"{label}: {', '.join(found) or 'none'}"

    return hint


def accelerator_constraints(wanted: Accelerator | None) -> list[Constraint]:
    """The accelerator ``wanted`` (or none), its memory, form factor and count."""
    if wanted is None:
        return [Constraint("no accelerator (CPU only)", lambda o: o.accelerator is None,
                            lambda _: "every offer left has an accelerator")]
    name = wanted.name.lower()
    constraints = [Constraint(
        f"accelerator {wanted.name}", lambda o: (o.accelerator or "").lower() == name,
        offered("accelerators in the catalog", lambda o: [o.accelerator]))]
    if (gb := wanted.memory_gb) is not None:
        constraints.append(Constraint(
            f"accelerator memory {wanted.memory}", lambda o: o.accelerator_memory_gb == gb,
            offered("memory sizes offered", lambda o: [f"{o.accelerator_memory_gb:g}GB"])))
    if wanted.form_factor:
        ff = wanted.form_factor.lower()
        constraints.append(Constraint(
            f"form_factor {wanted.form_factor}",
            lambda o: (o.accelerator_form_factor or "").lower() == ff,
            offered("form factors offered", lambda o: [o.accelerator_form_factor])))
    count = wanted.count
    constraints.append(Constraint(
        f"at least {count:g} accelerator(s) per node", lambda o: o.accelerator_count >= count,
        offered("counts per node offered", lambda o: [f"{o.accelerator_count:g}"])))
    return constraints


def shape_constraints(spec: Spec) -> list[Constraint]:
    """The machine's shape: architecture, vCPUs and memory."""
    out = []
    if arch := spec.architecture:
        out.append(Constraint(f"architecture {arch}", lambda o: o.architecture == arch,
                               offered("architectures", lambda o: [o.architecture])))
    if (vcpus := spec.vcpus) is not None:
        out.append(Constraint(f"vcpus >= {vcpus:g}", lambda o: o.vcpus >= vcpus,
                               lambda left: f"the most is {max(o.vcpus for o in left):g}"))
    if (memory := spec.memory_gb) is not None:
        out.append(Constraint(f"memory_gb >= {memory:g}", lambda o: o.memory_gb >= memory,
                               lambda left: f"the most is {max(o.memory_gb for o in left):g} GB"))
    return out
