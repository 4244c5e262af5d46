"""``skyward-iac ls``, ``down`` and ``logs``: the stacks that hold resources right now.

``ls`` lists them (age, nodes, cost so far, expiry, whether their owner still runs), ``down``
destroys one now, ``logs`` prints its nodes' bootstrap and agent logs, read over SSH with the
host keys the stack pinned (Local nodes run a real sshd too, so every provider takes the same
path).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import threading
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from skyward_iac.api.deadlines import seconds_left

#: Exit codes every command uses (documented in docs/operations.md).
OK, ERROR, USAGE, NOT_FOUND, REFUSED = 0, 1, 2, 3, 4
#: The node files ``logs`` prints (under each node's workdir): the bootstrap's output, then
#: the agent's.
LOG_FILES = ("log/bootstrap.log", "log/agent.log")


@dataclass(frozen=True, slots=True)
class LiveStack:
    """One stack holding resources, as ``ls`` shows it."""

    stack: str
    provider: str
    owner: str
    nodes: int
    resources: int
    created_at: str | None
    age_s: float | None
    #: The rate the stack runs at now (its ``usd_per_hour`` tag, kept true by resizes).
    usd_per_hour: float
    cost_usd: float
    expires_at: str
    owner_running: bool
    #: Until when a keeper keeps the stack's idle nodes for the next equal pool ("" if not).
    warm_until: str = ""
    #: Until when the owner's lease holds the stack against gc ("" for stacks without one).
    lease_until: str = ""
    #: Seconds the lease has left (negative: lapsed that long ago) on this machine's clock, for
    #: a lease this machine wrote; None without one, or for another machine's lease.
    lease_left_s: float | None = None
    #: Another machine's lease as this one judges it (``held`` or ``lapsed``), else "".
    lease_judged: str = ""
    #: The owner as this machine sees it: ``running``, ``gone``, ``alive elsewhere``,
    #: ``elsewhere, no lease`` ("" when not judged).
    owner_state: str = ""
    #: ``skyward_iac`` for a pool's stack; ``pulumi CLI (stacks/aws)`` for a cluster of the
    #: checkout's ``stacks/`` (no owner, lease or rate recorded: its config is the ops team's).
    managed_by: str = "skyward_iac"


def describe(name: str, tags: dict[str, str], resources: int, now: datetime,
             owner_running: bool, owner_state: str = "", lease_judged: str = "") -> LiveStack:
    """``ls``'s row for a stack from its tags: age and cost so far are measured to ``now``.
    ``lease_judged`` set: the lease is another machine's, whose time left this one cannot
    measure."""
    created = tags.get("created_at")
    age = (now - datetime.fromisoformat(created)).total_seconds() if created else None
    hourly = float(tags.get("usd_per_hour", 0) or 0)
    return LiveStack(
        stack=name, provider=tags.get("provider", "?"), owner=tags.get("owner", "?"),
        nodes=int(tags.get("nodes", 0) or 0), resources=resources, created_at=created,
        age_s=round(age, 1) if age is not None else None, usd_per_hour=hourly,
        cost_usd=round(hourly * max(age or 0.0, 0.0) / 3600, 4),
        expires_at=tags.get("expires_at", "never"), owner_running=owner_running,
        warm_until=tags.get("warm_until", ""),
        lease_until=tags.get("lease_until", ""),
        lease_left_s=None if lease_judged else seconds_left(tags.get("lease_until"), now),
        lease_judged=lease_judged, owner_state=owner_state,
    )


def describe_ops(stored: Any, now: datetime) -> LiveStack:
    """``ls``'s row for a ``stacks/`` cluster (``records.ops_clusters``, with its updates):
    its age from its first update; no owner, lease or rate, which only its config knows."""
    project = stored.name.split("/", 1)[0]
    directory = project.removeprefix("skyward-")
    first = min((u.start_time for u in stored.updates), default=None)
    created = first.replace(tzinfo=first.tzinfo or UTC) if first is not None else None
    return LiveStack(
        stack=stored.name, provider=directory, owner="-", nodes=0,
        resources=stored.resource_count,
        created_at=created.isoformat(timespec="seconds") if created else None,
        age_s=round((now - created).total_seconds(), 1) if created else None,
        usd_per_hour=0.0, cost_usd=0.0, expires_at="never", owner_running=False,
        owner_state="not judged", managed_by=f"pulumi CLI (stacks/{directory})")


def lease_text(row: LiveStack) -> str:
    """``ls``'s lease column: ``23s left``, ``lapsed 4m ago`` (a lease of this machine's),
    ``held`` or ``lapsed`` (another machine's, as judged here), or ``-`` without a lease."""
    if row.lease_judged:
        return row.lease_judged
    if row.lease_left_s is None:
        return "-"
    if row.lease_left_s >= 0:
        return f"{human_age(row.lease_left_s)} left"
    return f"lapsed {human_age(-row.lease_left_s)} ago"


def human_age(seconds: float | None) -> str:
    """``42s``, ``7m``, ``3h12m``, ``2d4h``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    seconds = int(max(seconds, 0))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"


def owner_running(stack: str, tags: dict[str, str]) -> bool:
    """Whether a process of this machine holds the stack: its creator, or a holder such as
    the adopter of a warm pool."""
    from skyward_iac.infra.stacks import gc
    from skyward_iac.infra.stacks.tags import StackRecord

    return gc.owner_state(StackRecord(stack, tags, 1), gc.look(())) == gc.RUNNING


def owner_text(state: str, judged: str) -> str:
    """``ls``'s word for a stack's owner from gc's ``owner_state`` (``running``, ``dead``,
    ``elsewhere``) and, for another machine's stack, its lease (``held``, ``lapsed``, "")."""
    if state == "running":
        return "running"
    if state == "dead" or judged == "lapsed":
        return "gone"
    return "alive elsewhere" if judged == "held" else "elsewhere, no lease"


def live_stacks() -> list[LiveStack]:
    """Every stack that holds resources, newest first, its owner judged as gc judges it."""
    from skyward_iac.infra.stacks import gc
    from skyward_iac.infra.stacks.records import ops_clusters
    from skyward_iac.infra.stacks.stack import list_records

    records = [r for r in list_records(only_live=True) if r.resource_count]
    seen = gc.look(records)
    rows = []
    for record in records:
        state = gc.owner_state(record, seen)
        judged = ""
        if state == gc.ELSEWHERE and record.tags.get("lease_until"):
            judged = "lapsed" if gc.lease_reason(record, seen) else "held"
        rows.append(describe(record.name, record.tags, record.resource_count, seen.now,
                             state == gc.RUNNING, owner_text(state, judged), judged))
    rows += [describe_ops(s, seen.now) for s in ops_clusters(updates=True) if s.resource_count]
    return sorted(rows, key=lambda row: row.created_at or "", reverse=True)


def add_commands(commands: Any) -> None:
    """Register ``ls``, ``down`` and ``logs`` on the CLI's sub-command parser."""
    ls = commands.add_parser(
        "ls", help="live stacks: age, nodes, cost so far, expiry",
        description="List the stacks that hold resources now, newest first.")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(run=run_ls)
    down = commands.add_parser(
        "down", help="destroy one stack now",
        description="Destroy a stack's resources now (its record and history stay). Destroying "
                    "a stack that is already down does nothing and succeeds. A stack whose owner "
                    "may still use it (its process runs here, its lease from another machine "
                    f"holds, or ttl=0 elsewhere) is refused (exit code {REFUSED}) unless "
                    "--force; who took it down and --reason go in its history.")
    down.add_argument("stack", help="stack name, as `skyward-iac ls` prints it")
    down.add_argument("--force", action="store_true",
                      help="destroy even while its owner may still use it (a live lease)")
    down.add_argument("--reason", metavar="TEXT",
                      help="why: recorded with who took it down in the stack's history")
    down.set_defaults(run=run_down)
    logs = commands.add_parser(
        "logs", help="the bootstrap and agent logs of a live stack's nodes",
        description="Print each node's bootstrap log (URL credentials hidden) and agent log, "
                    "read over SSH with the stack's pinned host keys; lines are prefixed with "
                    "[node N].")
    logs.add_argument("stack", help="stack name, as `skyward-iac ls` prints it")
    logs.add_argument("--node", type=int, metavar="N", help="only node N (default: every node)")
    logs.add_argument("--lines", type=int, default=200, metavar="K",
                      help="the last K lines of each log (default 200)")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep printing new lines until interrupted (Ctrl-C)")
    logs.set_defaults(run=run_logs, parser=logs)


def run_ls(args: argparse.Namespace) -> int:
    rows = live_stacks()
    if args.json:
        print(json.dumps([asdict(row) for row in rows], indent=2))
        return OK
    if not rows:
        print("no live stacks")
        return OK
    print(f"{'STACK':<44} {'NODES':>5} {'AGE':>7} {'USD/H':>9} {'COST':>9}  {'LEASE':<16} "
          "OWNER")
    for row in rows:
        if row.managed_by != "skyward_iac":  # no rate, lease or owner recorded: say who runs it
            print(f"{row.stack:<44} {'-':>5} {human_age(row.age_s):>7} {'-':>9} {'-':>9}  "
                  f"{'-':<16} {row.managed_by}, {row.resources} resources")
            continue
        state = f"warm until {row.warm_until}" if row.warm_until else row.owner_state
        print(f"{row.stack:<44} {row.nodes:>5} {human_age(row.age_s):>7} "
              f"{row.usd_per_hour:>9.4f} ${row.cost_usd:>8.4f}  {lease_text(row):<16} "
              f"{row.owner} ({state})")
    return OK


def run_down(args: argparse.Namespace) -> int:
    from skyward_iac.infra.stacks import destroy
    from skyward_iac.infra.stacks.takedown import down_reason

    who = destroy.Destroyer(destroy.DOWN, down_reason(args.force, args.reason),
                            force=args.force)
    outcome = destroy.destroy(args.stack, who)  # StackNotFoundError: exit code 3
    if outcome.status == destroy.ALREADY_DOWN:
        print(f"{args.stack} is already down")
        return OK
    if outcome.status == destroy.REFUSED:
        print(f"skyward-iac: {outcome.detail}", file=sys.stderr)
        return REFUSED
    if outcome.status == destroy.BUSY:
        print(f"skyward-iac: {args.stack} is locked by a running update; try again when it is "
              "done", file=sys.stderr)
        return ERROR
    if outcome.error is not None:
        raise outcome.error  # recorded as a failed destroy; the CLI explains the error
    print(f"{args.stack} destroyed ({outcome.message})")
    return OK


class PrefixedLines:
    """A text sink that writes each complete line to ``target`` as ``[node N] line``."""

    def __init__(self, node: int, target: TextIO, lock: threading.Lock) -> None:
        self.prefix = f"[node {node}] "
        self.target = target
        self.lock = lock
        self.partial = ""

    def write(self, text: str) -> int:
        head, newline, self.partial = (self.partial + text).rpartition("\n")
        if newline:
            with self.lock:
                self.target.write("".join(self.prefix + line + "\n"
                                          for line in head.split("\n")))
                self.target.flush()
        return len(text)

    def flush(self) -> None:
        if self.partial:
            self.write("\n")


def tail_command(workdir: str, lines: int, follow: bool) -> str:
    """The shell command printing a node's logs (``tail -F`` keeps following rotations)."""
    files = " ".join(shlex.quote(f"{workdir}/{name}") for name in LOG_FILES)
    return f"tail -q -n {lines} {'-F' if follow else ''} {files}"


def run_logs(args: argparse.Namespace) -> int:
    from skyward_iac.infra.stacks.stack import ClusterStack
    from skyward_iac.remote import ssh

    if args.lines < 0:
        args.parser.error(f"--lines must be >= 0, got {args.lines}")
    stack = ClusterStack.select(args.stack)
    if stack.resource_count() == 0:
        print(f"skyward-iac: {args.stack} is down; it has no nodes to read logs from",
              file=sys.stderr)
        return NOT_FOUND
    outputs = stack.outputs()
    nodes = [n for n in outputs.nodes if args.node is None or n.index == args.node]
    if not nodes:
        args.parser.error(f"--node {args.node}: {args.stack} has nodes "
                          f"{', '.join(str(n.index) for n in outputs.nodes)}")
    lock = threading.Lock()
    failures: list[str] = []

    def read(node: Any) -> None:
        sink = PrefixedLines(node.index, sys.stdout, lock)
        try:
            with ssh.connect(node, outputs.ssh_private_key, timeout=20) as conn:
                result = conn.run(tail_command(node.workdir, args.lines, args.follow),
                                  out_stream=sink, err_stream=sink, warn=True, in_stream=False)
            sink.flush()
            if result.exited != 0:
                failures.append(f"node {node.index}: tail exited {result.exited}")
        except Exception as exc:  # noqa: BLE001 - one node's failure is reported, others go on
            failures.append(f"node {node.index}: {exc}")

    threads = [threading.Thread(target=read, args=(node,), daemon=True) for node in nodes]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)  # a short join keeps Ctrl-C responsive
    except KeyboardInterrupt:
        return OK
    for failure in failures:
        print(f"skyward-iac: {failure}", file=sys.stderr)
    return ERROR if failures else OK
