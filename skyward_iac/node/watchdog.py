"""The dead-man switch of a Local node: when the client's heartbeat stops for ``ttl`` seconds,
the node shuts itself down (every process of its sandbox stopped, the sandbox removed).

The client writes ``<workdir>/heartbeat`` over SFTP while the pool lives; a client that
crashes, is killed or loses its network stops writing it. The watchdog never reads a time
from the file: every look it notes whether the file changed (inode, size, mtime, ctime) and,
on this node's monotonic clock, when it last saw a change, so a client whose clock is off by
any amount, either way, is judged by its beats alone (``api/deadlines.py``). Cloud nodes run
the same rule as a systemd service from cloud-init (``infra/programs/cloud_init.py``), where
"shut down" means powering off an instance whose shutdown behaviour is terminate.

A pool with a budget (``Options(max_cost_usd)``) also writes ``BUDGET_FILE`` beside the
heartbeat: how many seconds the budget leaves at the pool's current rate (``none``: no
deadline). Each time the watchdog sees that file change it reads it and sets the budget's
deadline that many seconds from then, on this node's clock, and stops the node when it passes:
a client that is gone cannot let its pool spend past its budget.
Run as ``python -m skyward_iac.node watchdog --heartbeat F --ttl S --sandbox DIR``.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from skyward_iac.api.deadlines import (
    BUDGET_FILE,
    next_look,
    observe_beat,
    read_budget_note,
    start_watch,
    watch_interval,
    watchdog_stop_reason,
)
from skyward_iac.processes import stop_sandbox

log = logging.getLogger("skyward.watchdog")


def beat_state(heartbeat: Path) -> str | None:
    """The heartbeat file's state as a token that changes with every write or stamp (None
    without a file). Its times are compared with nothing, only with their last value."""
    try:
        info = heartbeat.stat()
    except FileNotFoundError:
        return None
    return f"{info.st_ino}:{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}"


def _read(path: Path) -> str:
    """The file's text; empty when it is gone or unreadable (keeps the deadline as it is)."""
    try:
        return path.read_text(errors="replace")[:100]
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m skyward_iac.node watchdog",
                                     description=__doc__)
    parser.add_argument("--heartbeat", type=Path, required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--sandbox", type=Path, required=True)
    parser.add_argument("--max-lifetime", type=float, default=None)
    parser.add_argument("--first-contact", type=float, default=0.0,
                        help="silence allowed before the first beat (seconds; at least ttl)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log.info("watchdog %s: shutting the node down after %gs without a heartbeat (%gs before "
             "the first)%s", os.getpid(), args.ttl, max(args.ttl, args.first_contact),
             f" or {args.max_lifetime:g}s after start" if args.max_lifetime else "")
    started = time.monotonic()
    watch = start_watch(beat_state(args.heartbeat), started)
    interval = watch_interval(min((x for x in (args.ttl, args.max_lifetime) if x), default=60.0))
    budget = args.heartbeat.with_name(BUDGET_FILE)
    budget_seen: str | None = None
    budget_end: float | None = None
    while True:
        time.sleep(next_look(interval, time.monotonic(), budget_end))
        now = time.monotonic()
        watch = observe_beat(watch, beat_state(args.heartbeat), now)
        if (seen := beat_state(budget)) != budget_seen:
            budget_seen = seen
            before, budget_end = budget_end, read_budget_note(_read(budget), now, budget_end)
            if budget_end != before:
                log.info("budget: %s", "no deadline" if budget_end is None
                         else f"the node stops in {budget_end - now:.0f}s")
        reason = watchdog_stop_reason(watch, now, started=started, ttl=args.ttl,
                                      first_contact=args.first_contact,
                                      max_lifetime=args.max_lifetime, budget_end=budget_end)
        if reason is not None:
            log.warning("%s: shutting the node down", reason)
            stop_sandbox(args.sandbox)
            return

