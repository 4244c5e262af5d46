"""The kernel reaper's policy (which stacks a dead kernel owned) and its wait for the kernel's end,
on a real process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from skyward_iac.infra.stacks.tags import StackRecord, process_started
from skyward_iac.orchestration.kernel_reaper import owned_stacks, wait_for_exit
from skyward_iac.orchestration.notebook import cell_context, destroy_at_kernel_exit


def record(name: str, pid: str, started: str = "100", host: str = "h", resources: int = 3
           ) -> StackRecord:
    return StackRecord(name, {"pid": pid, "pid_started": started, "host": host}, resources)


def test_only_the_live_stacks_of_that_process_on_this_host_are_reaped() -> None:
    records = [
        record("mine", "42"),
        record("mine-destroyed", "42", resources=0),
        record("other-process", "43"),
        record("same-pid-reused", "42", started="999"),
        record("other-host", "42", host="elsewhere"),
        StackRecord("no-tags", {}, 2),
    ]
    assert owned_stacks(records, 42, "100", "h") == ["mine"]


def test_the_wait_ends_when_the_process_does() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    started = process_started(child.pid) or ""
    waited = threading.Thread(target=wait_for_exit, args=(child.pid, started))
    began = time.monotonic()
    waited.start()
    waited.join(timeout=0.5)
    assert waited.is_alive(), "it returned while the process still ran"
    child.wait()
    waited.join(timeout=10)
    assert not waited.is_alive()
    assert 1.0 < time.monotonic() - began < 10
    wait_for_exit(child.pid, started)  # already gone: returns at once


def test_outside_a_kernel_the_hooks_do_nothing() -> None:
    assert cell_context() is None
    assert destroy_at_kernel_exit() is None
