"""The plan file's format, as pure functions: its sealed digest, a stack-free engine plan (two
plans of similar pools diff without noise) and the resource list by logical name.

A plan file is JSON. Its ``digest`` is the SHA-256 of the canonical form (sorted keys, no
whitespace, UTF-8) of every other field: the stack, its times and plan ttl, the estimated
USD/hour, what the pool is made from (``source``), the facts its declaration depends on (spec,
offer, node counts, lifetime, tags), the planned resources and the engine's own update plan.
``skyward-iac plan`` prints it; ``skyward-iac apply --approved DIGEST`` runs only a file whose
content has exactly that digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

#: The plan file format; files of another format are refused (make a new plan).
PLAN_FORMAT = 2
#: Stands for the stack's name in the stored engine plan (the name appears in every URN).
STACK_PLACEHOLDER = "${stack}"
DIGEST_PREFIX = "sha256:"


class Planned(Protocol):
    """One planned resource (``infra.stacks.stack.PlannedResource``)."""

    op: str
    type: str
    name: str


def canonical(document: Mapping[str, Any]) -> bytes:
    """The bytes the digest is taken over: every field but ``digest``, keys sorted."""
    body = {key: value for key, value in document.items() if key != "digest"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def digest(document: Mapping[str, Any]) -> str:
    """``sha256:<64 hex>`` of ``canonical(document)``."""
    return DIGEST_PREFIX + hashlib.sha256(canonical(document)).hexdigest()


def same_digest(given: str, actual: str) -> bool:
    """Whether a digest as a reviewer typed it (with or without ``sha256:``, any case) is
    ``actual``; a shortened digest never matches."""
    text = given.strip().lower()
    return (text if text.startswith(DIGEST_PREFIX) else DIGEST_PREFIX + text) == actual


def stackless(engine_plan: Mapping[str, Any], stack: str) -> tuple[dict[str, Any], bool]:
    """The engine plan with the stack's name replaced by ``STACK_PLACEHOLDER``, and whether it
    was (not when the placeholder's text occurs in the plan already: then it is kept as is)."""
    text = json.dumps(engine_plan, sort_keys=True)
    if STACK_PLACEHOLDER in text or not stack:
        return dict(engine_plan), False
    return json.loads(text.replace(stack, STACK_PLACEHOLDER)), True


def with_stack(stored: Mapping[str, Any], stack: str, placeholder: bool) -> dict[str, Any]:
    """The engine plan as the engine wrote it (the inverse of ``stackless``)."""
    if not placeholder:
        return dict(stored)
    return json.loads(json.dumps(stored).replace(STACK_PLACEHOLDER, stack))


def resources_by_name(resources: Iterable[Planned]) -> dict[str, dict[str, str]]:
    """``{"node-0": {"op": "create", "type": ...}}`` in name order; a name two types share is
    keyed ``name [type]``."""
    items = list(resources)
    names = [r.name for r in items]
    table = {(r.name if names.count(r.name) == 1 else f"{r.name} [{r.type}]"):
             {"op": r.op, "type": r.type} for r in items}
    return dict(sorted(table.items()))


def local_node_owners(engine_plan: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The (sandbox directory, user) each Local node of ``engine_plan`` is planned with: a
    Local plan runs its nodes as that user under that directory, on the applier's machine."""
    found = set()
    for urn, planned in (engine_plan.get("resourcePlans") or {}).items():
        if ":LocalNode::" in urn:
            adds = ((planned.get("goal") or {}).get("inputDiff") or {}).get("adds") or {}
            if "sandbox_root" in adds and "user" in adds:
                found.add((str(adds["sandbox_root"]), str(adds["user"])))
    return found


def applier_mark(actor: str, nonce: str) -> str:
    """What an applier writes in the stack's ``plan_applied`` tag and its first update's
    message: who, and a nonce of this one attempt."""
    return f"{actor} [{nonce}]"


def first_applier(updates: Iterable[tuple[str, str]]) -> str | None:
    """The message of the stack's first ``update`` among ``(kind, message)`` pairs given
    newest first, or None before any. Updates run one at a time under the backend's lock, so
    of two appliers that both got past the tag check, the first update names the one that
    applied the plan."""
    messages = [message for kind, message in updates if kind == "update"]
    return messages[-1] if messages else None
