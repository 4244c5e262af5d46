"""The dead-man switch of a Local node: when the client's heartbeat stops for ``ttl`` seconds,
the node shuts itself down (every process of its sandbox stopped, the sandbox removed).

The client writes ``<workdir>/heartbeat`` over SFTP while the pool lives; a client that
crashes, is killed or loses its network stops writing it. The watchdog never reads a time
from the file: every look it notes whether the file changed (inode, size, mtime, ctime) and,
on this node's monotonic clock, when it last saw a change, so a client whose clock is off by
any amount, either way, is judged by its beats alone (``api/deadlines.py``). Cloud nodes run
the same rule as a systemd service from cloud-init (``infra/programs/cloud_init.py``), where
"shut down" means powering off an instance whose shutdown behaviour is terminate.
Run as ``python -m skyward_iac.remote.watchdog --heartbeat F --ttl S --sandbox DIR``.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from skyward_iac.api.deadlines import (
    observe_beat,
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
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
    while True:
        time.sleep(interval)
        now = time.monotonic()
        watch = observe_beat(watch, beat_state(args.heartbeat), now)
        reason = watchdog_stop_reason(watch, now, started=started, ttl=args.ttl,
                                      first_contact=args.first_contact,
                                      max_lifetime=args.max_lifetime)
        if reason is not None:
            log.warning("%s: shutting the node down", reason)
            stop_sandbox(args.sandbox)
            return


if __name__ == "__main__":
    main()
