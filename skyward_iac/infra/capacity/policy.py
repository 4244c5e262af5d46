"""Team guardrails: the team policy in the shared backend (``team_policy.py``), ``[policy]`` in
skyward.toml and the file named by ``SKYWARD_POLICY``.

Checked on every pool plan (``Compute``, ``preview``, ``plan``), before any stack exists: a
pool that breaks a rule is a ``PolicyError`` naming the rule, its limit and the pool's value.
Where several sources set a rule the strictest wins (smallest number, intersection of the
allow-lists, union of the required tags), so a project or a user can tighten the team policy,
never loosen it: no environment variable, argument or ``Options`` field lifts a backend rule.

Pulumi's policy packs (CrossGuard) run in a language host of their own next to the engine's;
our programs run inline in this process, so packs are not used: these rules are checked here,
on the plan. Like any client-side check they guard against mistakes, not against a user who
edits the file; hard limits belong in the cloud's IAM (AWS SCPs, GCP organization policies).
"""

from __future__ import annotations

import fnmatch
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from skyward_iac import config_file
from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.capacity import team_policy

POLICY_ENV = "SKYWARD_POLICY"


class PolicyError(ConfigError):
    """A pool breaks the team policy (a ``ConfigError``: nothing was provisioned)."""


@dataclass(frozen=True, slots=True)
class Policy:
    """The rules; None (or empty ``required_tags``) leaves a rule off."""

    max_usd_per_hour: float | None = None
    max_nodes: int | None = None
    max_ttl: int | None = None
    max_lifetime: int | None = None
    max_cost_usd: float | None = None
    allowed_providers: tuple[str, ...] | None = None
    allowed_regions: tuple[str, ...] | None = None
    allowed_instance_types: tuple[str, ...] | None = None
    required_tags: tuple[str, ...] = ()
    #: Where each rule came from, for the error message.
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self) if f.name != "sources")


@dataclass(frozen=True, slots=True)
class PoolFacts:
    """What the rules look at in a planned pool."""

    provider: str
    region: str | None
    instance_type: str | None
    #: Estimated USD/hour at the pool's maximum size (what it may cost, not what it starts at).
    usd_per_hour: float
    max_nodes: int
    ttl: int
    max_lifetime: int | None
    tags: Mapping[str, str]
    #: ``Options(max_cost_usd)``: what the pool may spend in all (None: no budget).
    max_cost_usd: float | None = None


NUMBERS = {"max_usd_per_hour": float, "max_nodes": int, "max_ttl": int, "max_lifetime": int,
           "max_cost_usd": float}
LISTS = ("allowed_providers", "allowed_regions", "allowed_instance_types", "required_tags")


def parse(table: Mapping[str, Any], source: str) -> Policy:
    """A ``[policy]`` table as a ``Policy``; unknown keys and bad values are ``ConfigError``s."""
    unknown = sorted(set(table) - set(NUMBERS) - set(LISTS))
    if unknown:
        raise ConfigError(f"{source}: unknown policy rule(s) {', '.join(unknown)}; known: "
                          f"{', '.join([*NUMBERS, *LISTS])}")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in NUMBERS:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{source}: policy.{key} must be a positive number, "
                                  f"got {value!r}")
            values[key] = NUMBERS[key](value)
        else:
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"{source}: policy.{key} must be a list of strings, "
                                  f"got {value!r}")
            values[key] = tuple(value)
    return Policy(**values, sources={key: source for key in values})


def as_table(policy: Policy) -> dict[str, Any]:
    """The rules ``policy`` sets, as a ``[policy]`` table (what ``parse`` reads back)."""
    table: dict[str, Any] = {}
    for name in [*NUMBERS, *LISTS]:
        value = getattr(policy, name)
        if value is not None and not (name == "required_tags" and not value):
            table[name] = list(value) if isinstance(value, tuple) else value
    return table


def read_file(path: Path) -> Policy:
    """A policy file: its ``[policy]`` table, or its top level."""
    document = _read(path)
    if document is None:
        raise ConfigError(f"{path}: no such policy file")
    return parse(document.get("policy", document), str(path))


def strictest(policies: Iterable[Policy]) -> Policy:
    """One policy holding, for every rule, the strictest value any of ``policies`` sets."""
    merged = Policy()
    for policy in policies:
        changes: dict[str, Any] = {}
        sources = dict(merged.sources)
        for name in [*NUMBERS, *LISTS]:
            mine, theirs = getattr(merged, name), getattr(policy, name)
            if theirs is None or (name == "required_tags" and not theirs):
                continue
            if mine is None or (name == "required_tags" and not mine):
                value = theirs
            elif name in NUMBERS:
                value = min(mine, theirs)
            elif name == "required_tags":
                value = tuple(dict.fromkeys([*mine, *theirs]))
            else:
                value = narrowest(mine, theirs)
            if value != mine:
                changes[name] = value
                theirs_from = policy.sources.get(name, "?")
                sources[name] = (theirs_from if name in NUMBERS or value == theirs
                                 else f"{sources.get(name, '?')} and {theirs_from}")
        merged = replace(merged, **changes, sources=sources)
    return merged


def narrowest(mine: Sequence[str], theirs: Sequence[str]) -> tuple[str, ...]:
    """The allow-list both lists allow (shell-style patterns): each pattern of one list kept
    when a pattern of the other covers it (``g5.xlarge`` and ``eu-west-*`` are under ``g5.*``
    and ``eu-*``). Two patterns that overlap without one covering the other are dropped:
    the merge may allow less than both, never more."""
    kept = [p for p in mine if any(covers(q, p) for q in theirs)]
    kept += [p for p in theirs if any(covers(q, p) for q in mine)]
    return tuple(dict.fromkeys(kept))


def covers(pattern: str, other: str) -> bool:
    """Whether every name ``other`` matches is matched by ``pattern`` too (sound, not
    complete: a literal name, the same pattern, or a ``prefix*`` over a pattern that starts
    with that prefix)."""
    if pattern == other:
        return True
    if not any(c in other for c in "*?["):
        return fnmatch.fnmatchcase(other, pattern)
    prefix = pattern[:-1]
    return (pattern.endswith("*") and not any(c in prefix for c in "*?[")
            and other.startswith(prefix))


def violations(policy: Policy, pool: PoolFacts) -> list[str]:
    """Every rule ``pool`` breaks, one sentence each naming the rule, its limit and the value."""
    found: list[str] = []

    def broken(rule: str, text: str) -> None:
        found.append(f"policy.{rule} ({policy.sources.get(rule, '?')}): {text}")

    if policy.max_usd_per_hour is not None and pool.usd_per_hour > policy.max_usd_per_hour:
        broken("max_usd_per_hour", f"the pool may cost ${pool.usd_per_hour:.4f}/h at "
               f"{pool.max_nodes} node(s), over the ${policy.max_usd_per_hour:g}/h limit")
    if policy.max_nodes is not None and pool.max_nodes > policy.max_nodes:
        broken("max_nodes", f"the pool may grow to {pool.max_nodes} nodes, over the limit of "
               f"{policy.max_nodes}")
    if policy.max_ttl is not None and (pool.ttl == 0 or pool.ttl > policy.max_ttl):
        shown = "0 (no dead-man switch)" if pool.ttl == 0 else f"{pool.ttl} s"
        broken("max_ttl", f"ttl is {shown}, the limit is {policy.max_ttl} s")
    if policy.max_lifetime is not None and (pool.max_lifetime is None
                                            or pool.max_lifetime > policy.max_lifetime):
        shown = "not set" if pool.max_lifetime is None else f"{pool.max_lifetime} s"
        broken("max_lifetime", f"Options(max_lifetime) is {shown}, the limit is "
               f"{policy.max_lifetime} s (set Options(max_lifetime=...) at most that)")
    if policy.max_cost_usd is not None and (pool.max_cost_usd is None
                                            or pool.max_cost_usd > policy.max_cost_usd):
        shown = "not set" if pool.max_cost_usd is None else f"${pool.max_cost_usd:g}"
        broken("max_cost_usd", f"Options(max_cost_usd) is {shown}, the limit is "
               f"${policy.max_cost_usd:g} (set Options(max_cost_usd=...) at most that)")
    for rule, value in (("allowed_providers", pool.provider),
                        ("allowed_regions", pool.region),
                        ("allowed_instance_types", pool.instance_type)):
        allowed: Sequence[str] | None = getattr(policy, rule)
        if allowed is None or value is None:
            continue  # Local has no region or instance type
        if not any(fnmatch.fnmatchcase(value, pattern) for pattern in allowed):
            broken(rule, f"{value!r} is not one of {', '.join(allowed) or '(none)'}")
    if missing := [tag for tag in policy.required_tags if not pool.tags.get(tag)]:
        broken("required_tags", f"missing tag(s) {', '.join(missing)}: set "
               f"Options(tags={{{', '.join(repr(t) + ': ...' for t in missing)}}})")
    return found


def check(policy: Policy, pool: PoolFacts) -> None:
    """Raise ``PolicyError`` listing every rule ``pool`` breaks."""
    if problems := violations(policy, pool):
        raise PolicyError("the team policy refuses this pool (nothing was provisioned):\n  "
                          + "\n  ".join(problems))


def load(cwd: Path | None = None) -> Policy:
    """The policy in force: the team policy in the backend, the file named by
    ``SKYWARD_POLICY`` (its ``[policy]`` table, or its top level) and ``[policy]`` in
    skyward.toml, merged strictest-wins. A team policy that cannot be read is a
    ``TeamPolicyError`` (fail closed), never a lifted rule."""
    found: list[Policy] = []
    if (team := team_policy.read()) is not None:
        found.append(parse(team.rules, team_source(team)))
    if named := os.environ.get(POLICY_ENV):
        path = Path(named).expanduser()
        if not path.is_file():
            raise ConfigError(f"{POLICY_ENV}={named}: no such policy file")
        found.append(read_file(path))
    project = config_file.find_project_file(cwd)
    if project is not None and (document := _read(project)) and "policy" in document:
        found.append(parse(document["policy"], str(project)))
    return strictest(found)


def team_source(team: team_policy.Stored) -> str:
    """How a team rule names its source in a refusal: where, who pushed it and when."""
    return f"team policy {team.where}, pushed by {team.by} at {team.at}"


def _read(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except (tomllib.TOMLDecodeError, OSError) as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from None
