"""An update the cloud refused in part, run again without that part, as its program decides.

Some refusals leave a pool that still works if the program declares less: GCP projects that
forbid creating service accounts (``programs/gcp_identity.py``) run nodes without one. A cloud
program says which failed resources it can do without (``StackProgram.fallback``, pure, from
each failed resource's error text); ``ClusterStack.up`` stores the decision in the stack's
config, warns, and runs the update once more, and every later run declares the same. Each
fallback is taken once per stack (a decision already stored is not a way out again), and never
under a reviewed plan, whose apply must do what was reviewed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from skyward_iac.infra.programs.decisions import Fallback, StackProgram


class ResourceErrors:
    """An engine ``on_event`` that records each failed resource's error text by its logical
    name (the URN's last part) and passes every event on to ``forward``."""

    def __init__(self, forward: Callable[[Any], Any] | None = None) -> None:
        self.forward = forward
        self.by_name: dict[str, str] = {}

    def __call__(self, event: Any) -> None:
        diagnostic = getattr(event, "diagnostic_event", None)
        if diagnostic is not None and str(getattr(diagnostic, "severity", "")) == "error":
            urn = getattr(diagnostic, "urn", None) or ""
            if "::" in urn:
                name = urn.rsplit("::", 1)[-1]
                text = str(getattr(diagnostic, "message", ""))
                self.by_name[name] = f"{self.by_name[name]}\n{text}" if name in self.by_name \
                    else text
        if self.forward is not None:
            self.forward(event)


def fallback_for(program: Any, errors: Mapping[str, str]) -> Fallback | None:
    """The fallback ``program`` takes after a failed update whose resources failed with
    ``errors``; None when it has none, or only one its run already read from the stack."""
    if not isinstance(program, StackProgram) or program.fallback is None \
            or program.recorder is None:
        return None
    fallback = program.fallback(errors)
    stored = program.recorder.stored
    if fallback is None or all(stored.get(k) == v for k, v in fallback.values.items()):
        return None
    return fallback
