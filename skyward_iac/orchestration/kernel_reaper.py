"""The kernel's reaper: when a Jupyter kernel ends, destroy the stacks it still owned.

Started detached by ``notebook.destroy_at_kernel_exit()`` at the kernel's first pool, as
``python -m skyward_iac.orchestration.kernel_reaper --pid PID --started TICKS``. It sleeps
until that process is gone (pidfd where the OS has it), then destroys every live stack whose
owner tags name that process on this host, and exits. Pulumi is imported only then.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import socket
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from skyward_iac.api import retry
from skyward_iac.infra.stacks.tags import StackRecord, process_started
from skyward_iac.processes import is_alive

if TYPE_CHECKING:
    from skyward_iac.infra.stacks.destroy import Outcome

log = logging.getLogger("skyward.kernel_reaper")
#: How long a stack locked by someone else (a gc run) is waited for before giving up on it
#: (``api/retry.for_stack_lock``: the destroy path tries again within it).
BUSY_PATIENCE = retry.REAPER_PATIENCE


def owned_stacks(records: Iterable[StackRecord], pid: int, started: str, host: str) -> list[str]:
    """The stacks still holding resources that the process ``pid`` (started at ``started``)
    created on ``host``."""
    return [
        record.name for record in records
        if record.resource_count > 0
        and record.tags.get("host") == host
        and record.tags.get("pid") == str(pid)
        and (not started or record.tags.get("pid_started", "") in ("", started))
    ]


def wait_for_exit(pid: int, started: str, poll: float = 1.0) -> None:
    """Return once ``pid`` has ended (a reused pid, started at another time, counts as ended)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux >= 5.3, or the process is gone already
        fd = None
    if fd is not None:
        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)
        return
    # A watch, not a retry: nothing failed, the kernel is still running.
    while is_alive(pid) and (not started or process_started(pid) == started):
        time.sleep(poll)


def destroy(name: str, pid: int) -> Outcome:
    """Destroy one stack left by the kernel ``pid`` through the one destroy path: the kernel
    is gone, so the path lets it go unless another process holds the stack now (an adopter of
    its warm pool)."""
    from skyward_iac.infra.stacks import destroy as destroy_path

    return destroy_path.destroy(name, destroy_path.Destroyer(
        destroy_path.REAPER, f"the Jupyter kernel (pid {pid}) ended", patience=BUSY_PATIENCE))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pid", type=int, required=True, help="the kernel's process id")
    parser.add_argument("--started", default="", help="its start time (tells a reused pid apart)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s reaper of kernel {args.pid}: %(message)s")
    wait_for_exit(args.pid, args.started)
    from skyward_iac.infra.stacks.stack import list_records

    names = owned_stacks(list_records(only_live=True), args.pid, args.started,
                         socket.gethostname())
    log.info("kernel ended; %d stack(s) to destroy: %s", len(names), ", ".join(names) or "none")
    failed = 0
    for name in names:
        try:
            outcome = destroy(name, args.pid)
            why = outcome.detail
        except Exception as exc:  # noqa: BLE001 - one stack's failure must not stop the others
            outcome, why = None, str(exc)
        if outcome is not None and outcome.gone:
            log.info("%s: %s", name, outcome.status)
        elif outcome is not None and outcome.error is None:  # refused: another holds it now
            log.warning("%s: left alone: %s", name, why)
        else:
            failed += 1
            log.error("%s: destroy failed (`skyward-iac gc` collects it later, `skyward-iac "
                      "down %s` now): %s", name, name, why)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
