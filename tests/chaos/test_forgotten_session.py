"""A script that never closes its ``sky.Session`` leaves nothing running once it ends.

Each test runs ``forgotten_session.py`` as a real client process with a real Local pool at
the default ttl (600 s, so the nodes' own dead-man switch cannot be what stops them), and
checks after it exited: no process or sandbox of the stack (within 30 s; the destroy runs
before the exit, so nothing is usually left at all), no resource in the stack, and the
stack's history saying how the run ended. The chaos leak check runs after each test too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.orchestration.at_exit import HOW
from tests.chaos.test_lifecycle_chaos import wait_until_gone
from tests.helpers import interrupted_script, stack_processes

pytestmark = pytest.mark.chaos
SCRIPT = Path(__file__).with_name("forgotten_session.py")
ROOT = Path(__file__).resolve().parents[2]


def run_script(mode: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the script to its end; its result and the stack it made."""
    done = subprocess.run([sys.executable, str(SCRIPT), mode], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    found = re.search(r"^READY (\S+)$", done.stdout, re.MULTILINE)
    assert found, done.stdout + done.stderr
    return done, found.group(1)


def assert_nothing_left(stack: str, output: str) -> None:
    left_at_exit = stack_processes(stack)
    wait_until_gone(stack, timeout=30)
    assert not left_at_exit, f"pids {left_at_exit} outlived the script:\n{output[-3000:]}"
    assert ClusterStack.select(stack).resource_count() == 0, output[-3000:]
    assert HOW in (ClusterStack.select(stack).history()[0].message or "")


@pytest.mark.parametrize("mode", ["end", "raise"])
def test_a_session_never_closed_is_destroyed_when_the_script_ends(mode: str) -> None:
    done, stack = run_script(mode)
    output = done.stdout + done.stderr
    assert done.returncode == (1 if mode == "raise" else 0), output[-3000:]
    assert "DONE" in done.stdout
    assert "sky.Session that was never closed" in done.stderr  # the user is told
    assert "ResourceWarning" not in done.stderr  # the session object lived to the end
    assert_nothing_left(stack, output)


def test_a_garbage_collected_session_warns_and_its_pool_still_goes_at_exit() -> None:
    done, stack = run_script("dropped")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert re.search(r"ResourceWarning: sky.Session garbage-collected without close\(\); its "
                     rf"1 pool\(s\) \({stack}\)", done.stderr), done.stderr[-3000:]
    assert_nothing_left(stack, output)


def test_a_thread_still_waiting_on_the_pool_gets_an_error_and_the_script_exits() -> None:
    """A non-daemon thread blocks the exit until it ends: the pool is closed first (as
    concurrent.futures stops its pools first), so its call fails and the script can end."""
    done, stack = run_script("thread")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert re.search(rf"^THREAD NodeConnectionError: pool {stack} closed", done.stdout,
                     re.MULTILINE), output[-3000:]
    assert_nothing_left(stack, output)


def test_a_ctrl_c_during_the_exit_destroy_exits_by_sigint_and_still_destroys() -> None:
    """The destroy at exit needs the thread pools, which stop once the exit hook returns: a
    Ctrl+C there is noted (exit by SIGINT, as any Ctrl+C) and the destroy still waited for."""
    status, output = interrupted_script([str(SCRIPT), "end"],
                                        "sky.Session that was never closed", ROOT)
    assert status == -signal.SIGINT, output[-3000:]
    assert "still destroying" in output, output[-3000:]
    stack = re.search(r"^READY (\S+)$", output, re.MULTILINE)
    assert stack, output[-3000:]
    assert_nothing_left(stack.group(1), output)
