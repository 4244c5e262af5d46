"""The dead-man switch of a Local node: when the client's heartbeat stops for ``ttl`` seconds,
the node shuts itself down (every process of its sandbox stopped, the sandbox removed).

The client touches ``<workdir>/heartbeat`` over SFTP while the pool lives; a client that
crashes, is killed or loses its network stops touching it. Cloud nodes run the same rule as a
systemd service from cloud-init (``infra/programs/cloud_init.py``), where "shut down" means
powering off an instance whose shutdown behaviour is terminate.
Run as ``python -m skyward_iac.remote.watchdog --heartbeat F --ttl S --sandbox DIR``.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from skyward_iac.processes import stop_sandbox

log = logging.getLogger("skyward.watchdog")


def silent_for(heartbeat: Path, now: float | None = None) -> float:
    """Seconds since the last heartbeat (since the file's creation if it was never touched)."""
    try:
        last = heartbeat.stat().st_mtime
    except FileNotFoundError:
        return float("inf")
    return (now if now is not None else time.time()) - last


def check_interval(ttl: float) -> float:
    """How often to look: a quarter of the ttl, between 0.5 and 15 seconds."""
    return min(15.0, max(0.5, ttl / 4))


def stop_reason(silence: float, ttl: float, age: float, max_lifetime: float | None) -> str | None:
    """Why the node must stop now (no heartbeat for ``ttl``, or older than ``max_lifetime``),
    or None while it may live on."""
    if ttl and silence > ttl:
        return f"no heartbeat for {silence:.0f}s (ttl {ttl:g}s)"
    if max_lifetime and age > max_lifetime:
        return f"it reached its max_lifetime of {max_lifetime:g}s"
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--heartbeat", type=Path, required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--sandbox", type=Path, required=True)
    parser.add_argument("--max-lifetime", type=float, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log.info("watchdog %s: shutting the node down after %gs without a heartbeat%s", os.getpid(),
             args.ttl, f" or {args.max_lifetime:g}s after start" if args.max_lifetime else "")
    started = time.monotonic()
    interval = check_interval(min((x for x in (args.ttl, args.max_lifetime) if x), default=60.0))
    while True:
        time.sleep(interval)
        reason = stop_reason(silent_for(args.heartbeat), args.ttl, time.monotonic() - started,
                             args.max_lifetime)
        if reason is not None:
            log.warning("%s: shutting the node down", reason)
            stop_sandbox(args.sandbox)
            return


if __name__ == "__main__":
    main()
