"""After every chaos test, a leak check: nothing a pool starts outlives the test.

It counts, by kind, the processes of this session's home (sshd, agent, worker, etcd, watchdog,
warm-pool keeper, the engine's ``pulumi.dynamic`` provider processes), the node
sandboxes on disk and the resources of every stack the test created, and fails when any of
them is left once the test is over (after a grace period: a destroy's last processes may still
be exiting).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward_iac.infra.stacks import home

#: How long what a test started may take to go away after it.
GRACE = 30.0

#: A process's kind, by what its command line holds.
KINDS = {
    "agent": "skyward_iac.node agent",
    "worker": "skyward_iac.node worker",
    "watchdog": "skyward_iac.node watchdog",
    "keeper": "skyward_iac.orchestration.keeper",
    "provider": "pulumi.dynamic",
    "provider host": "skyward_iac.infra.provider_host",
    "etcd": "/etcd",
    "sshd": "sshd",
}


def _command_line(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _zombie(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def processes(home_dir: Path) -> dict[int, str]:
    """Live processes a pool of this home can leave, as pid -> kind: those whose command line,
    working directory or environment names the home (a node's sandbox is inside it; the
    engine's providers and the keepers inherit ``SKYWARD_HOME``). Other homes' processes, such
    as another pytest worker's, are not this session's to judge."""
    found: dict[int, str] = {}
    marker = str(home_dir)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid() or _zombie(proc.name):
            continue
        command = _command_line(proc.name)
        kind = next((k for k, needle in KINDS.items() if needle in command), None)
        if kind is None:
            continue
        try:
            where = os.readlink(proc / "cwd")
            environ = (proc / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker not in command and marker not in where and marker not in environ:
            continue
        found[int(proc.name)] = kind
    return found


def sandboxes(nodes_dir: Path) -> set[Path]:
    return set(nodes_dir.glob("*/node-*")) if nodes_dir.exists() else set()


def stacks_with_resources(before: set[str]) -> dict[str, int]:
    """Stacks created since ``before`` that still hold resources."""
    from skyward_iac.infra.stacks.stack import list_records

    return {record.name: record.resource_count for record in list_records(only_live=True)
            if record.name not in before and record.resource_count}


def failed(request: pytest.FixtureRequest) -> bool:
    """Whether the test's own call failed (its report is kept by ``pytest_runtest_makereport``)."""
    report = getattr(request.node, "call_report", None)
    return report is not None and report.failed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if call.when == "call":
        item.call_report = outcome.get_result()  # type: ignore[attr-defined]


def _leaks(nodes_dir: Path, pids_before: set[int], sandboxes_before: set[Path],
           stacks_before: set[str]) -> list[str]:
    leaks = [f"{kind} process {pid}: {_command_line(str(pid))[:160]}"
             for pid, kind in processes(home.skyward_home()).items() if pid not in pids_before]
    leaks += [f"sandbox {path}" for path in sorted(sandboxes(nodes_dir) - sandboxes_before)]
    leaks += [f"stack {name} holds {count} resource(s)"
              for name, count in stacks_with_resources(stacks_before).items()]
    return leaks


@pytest.fixture(autouse=True)
def leak_check(request: pytest.FixtureRequest) -> Iterator[None]:
    from skyward_iac.infra.stacks.stack import list_records
    from tests.chaos.test_lifecycle_chaos import Child

    nodes_dir = home.local_nodes_dir()
    pids_before = set(processes(home.skyward_home()))
    sandboxes_before = sandboxes(nodes_dir)
    stacks_before = {record.name for record in list_records(only_live=False)}
    yield
    # A test that failed before it ended its child client leaves it running: ended here, so
    # the failure is the test's own and not also every later test's leak.
    if (left := Child.kill_the_left_over(grace=0 if failed(request) else 10)) \
            and not failed(request):
        pytest.fail(f"the test left child client(s) running: {left}", pytrace=False)
    deadline = time.monotonic() + GRACE
    while leaks := _leaks(nodes_dir, pids_before, sandboxes_before, stacks_before):
        if time.monotonic() > deadline:
            pytest.fail("left behind by the test:\n  " + "\n  ".join(leaks), pytrace=False)
        time.sleep(0.5)
