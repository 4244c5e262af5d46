"""``skyward-iac policy push|show|diff``: the team policy stored in the shared backend
(``infra/capacity/team_policy.py``), and the policy in force on this machine."""

from __future__ import annotations

import argparse
import json
from typing import Any

from skyward_iac.cli_commands.paths import path_arg


def add_commands(commands: Any) -> None:
    """Register ``policy`` and its sub-commands on the root parser's sub-commands."""
    parser = commands.add_parser(
        "policy", help="the team policy in the shared backend: push, show, diff",
        description="The team policy lives in the shared backend (<backend>/.skyward/"
                    "policy.toml) and binds every client of that backend: it is merged "
                    "strictest-wins with skyward.toml's [policy] and SKYWARD_POLICY, which can "
                    "only tighten it. `plan`, `apply` and every pool check it before anything "
                    "is created.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    push = actions.add_parser("push", help="store FILE's [policy] as the team policy",
                              description="Check FILE (its [policy] table, or its top level) "
                                          "and store it as the team policy, with who pushed it "
                                          "and when. An empty [policy] removes the rules.")
    push.add_argument("file", type=path_arg, help="a TOML file with a [policy] table")
    push.set_defaults(run=run_push)
    show = actions.add_parser("show", help="the team policy, and the policy in force here")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(run=run_show)
    diff = actions.add_parser("diff", help="what pushing FILE would change, rule by rule")
    diff.add_argument("file", type=path_arg, help="a TOML file with a [policy] table")
    diff.set_defaults(run=run_diff)


def run_push(args: argparse.Namespace) -> int:
    from skyward_iac.infra.capacity import policy, team_policy

    rules = policy.as_table(policy.read_file(args.file))
    try:
        before = team_policy.read()
    except team_policy.TeamPolicyError as exc:  # ops restoring a lost or edited one
        print(f"replacing a team policy that cannot be used: {exc}")
        before = None
    stored = team_policy.push(rules)
    print(f"team policy pushed to {stored.where}\n  by {stored.by} ({stored.by_source}) at "
          f"{stored.at}\n  digest {stored.digest}")
    for line in changes(before.rules if before else {}, rules) or ["no rule changed"]:
        print(f"  {line}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from skyward_iac.infra.capacity import policy, team_policy

    team = team_policy.read()
    effective = policy.load()
    rules = policy.as_table(effective)
    where = team_policy.location()
    report: dict[str, Any] = {
        "where": where,
        "team": None if team is None else {
            "rules": team.rules, "pushed_by": team.by, "pushed_by_source": team.by_source,
            "pushed_at": team.at, "digest": team.digest},
        "in_force": {"rules": rules,
                     "sources": {k: v for k, v in effective.sources.items() if k in rules}},
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    if where is None:
        print("this backend holds no team policy (only file:// and s3:// backends do)")
    elif team is None:
        print(f"no team policy in {where} (`skyward-iac policy push FILE` stores one)")
    else:
        print(f"team policy {team.where}\n  pushed by {team.by} ({team.by_source}) at "
              f"{team.at}\n  digest {team.digest}")
        for key, value in sorted(team.rules.items()):
            print(f"  {key} = {json.dumps(value)}")
    print("in force here (strictest of the team policy, skyward.toml and SKYWARD_POLICY):")
    for key, value in sorted(rules.items()):
        print(f"  {key} = {json.dumps(value)}  ({effective.sources.get(key, '?')})")
    if not rules:
        print("  (no rules)")
    return 0


def run_diff(args: argparse.Namespace) -> int:
    from skyward_iac.infra.capacity import policy, team_policy

    rules = policy.as_table(policy.read_file(args.file))
    team = team_policy.read()
    lines = changes(team.rules if team else {}, rules)
    print(f"team policy {team_policy.location()} -> {args.file}:")
    for line in lines or ["no rule changes"]:
        print(f"  {line}")
    return 0


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Each rule that differs: ``max_nodes: 4 -> 2``, ``(unset)`` for a rule one side lacks."""
    return [f"{key}: {json.dumps(before[key]) if key in before else '(unset)'} -> "
            f"{json.dumps(after[key]) if key in after else '(unset)'}"
            for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
