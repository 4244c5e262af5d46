"""``skyward-iac ls/logs/show/history/down`` against a real Local stack owned by a child process.

The child (tests/chaos/child_pool.py) keeps a 1-node pool open, so the stack has a live owner;
``down`` refuses it until ``--force``. The owner is frozen (SIGSTOP) before the forced destroy,
so it cannot react to losing its node by recreating it.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward_iac.cli_commands.live import NOT_FOUND, REFUSED
from skyward_iac.infra.stacks.stack import ClusterStack
from tests.chaos.test_lifecycle_chaos import ROOT, Child, holding_pool, wait_until_gone
from tests.unit.test_cli_offers import run as cli  # skyward-iac in this process: code, out, err


@pytest.fixture(scope="module")
def owner() -> Iterator[Child]:
    """A child process holding a 1-node Local pool open (its stack is the one under test)."""
    with holding_pool(nodes=1, ttl=120) as child:
        yield child


def test_ls_lists_the_live_stack_with_its_owner_running(owner: Child,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "ls", "--json")
    assert code == 0, err
    [row] = [r for r in json.loads(out) if r["stack"] == owner.stack]
    assert row["provider"] == "local" and row["nodes"] == 1 and row["resources"] >= 2
    assert row["owner_running"] is True
    assert 0 < row["age_s"] < 600 and row["cost_usd"] == 0.0  # Local costs nothing
    assert row["expires_at"] != "never"
    assert row["usd_per_hour"] == 0.0 and row["managed_by"] == "skyward_iac"
    code, out, _ = cli(capsys, "ls")
    assert code == 0 and "USD/H" in out.splitlines()[0]  # the rate column
    line = next(line for line in out.splitlines() if line.startswith(owner.stack or "?"))
    assert "(running)" in line and "$  0.0000" in line


def test_logs_print_each_nodes_agent_log_over_ssh(owner: Child,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "logs", owner.stack or "?")
    assert code == 0, err
    lines = out.splitlines()
    assert lines and all(line.startswith("[node 0] ") for line in lines)
    assert any("agent of node 0 listening" in line for line in lines)
    code, _, err = cli(capsys, "logs", owner.stack or "?", "--node", "7")
    assert code == 2 and "has nodes 0" in err


def test_logs_follow_prints_new_lines_as_they_are_written(owner: Child) -> None:
    stack = owner.stack or "?"
    follower = subprocess.Popen(
        [sys.executable, "-m", "skyward_iac.cli", "logs", stack, "--follow", "--lines", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL)
    seen: list[str] = []
    threading.Thread(target=lambda: seen.extend(follower.stdout or ()), daemon=True).start()
    try:
        wait_for(lambda: len(seen) >= 1, 60, seen)
        # Make the agent write a new line: a connection without the stack token is logged.
        # (A Local node's agent listens on this machine's 127.0.0.1, its port in its workdir.)
        workdir = Path(ClusterStack.select(stack).outputs().nodes[0].workdir)
        port = int((workdir / "run" / "agent.port").read_text())
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"\x00\x00\x00\x04\x00nope")
            sock.recv(1)
        wait_for(lambda: any("rejected a connection" in line for line in seen), 30, seen)
        assert follower.poll() is None  # still following
    finally:
        follower.terminate()
        follower.wait(10)
    assert all(line.startswith("[node 0] ") for line in seen)


def test_show_and_history_include_the_stack(owner: Child,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "show", owner.stack or "?", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["resources"] >= 2 and report["updates"][0]["kind"] == "update"
    code, out, err = cli(capsys, "history", "--json")
    assert code == 0, err
    [run] = [r for r in json.loads(out) if r["stack"] == owner.stack]
    assert run["ended"] == "running" and run["nodes"] == 1


def test_down_refuses_a_live_owner_then_force_destroys_and_repeats_harmlessly(
        owner: Child, capsys: pytest.CaptureFixture[str]) -> None:
    stack = owner.stack or "?"
    owner.signal(signal.SIGSTOP)  # alive but unable to replace the node we destroy
    try:
        code, _, err = cli(capsys, "down", stack)
        assert code == REFUSED and "still runs on this machine" in err
        assert f"skyward-iac down {stack} --force --reason" in err
        assert ClusterStack.select(stack).resource_count() > 0
        code, out, err = cli(capsys, "down", stack, "--force", "--reason", "a hung owner")
        assert code == 0, err
        assert f"{stack} destroyed" in out
        assert ClusterStack.select(stack).resource_count() == 0
        wait_until_gone(stack, 30)  # sshd and agent of the node stopped, sandbox removed
        code, out, _ = cli(capsys, "down", stack)
        assert code == 0 and "already down" in out
        code, out, _ = cli(capsys, "ls", "--json")
        assert stack not in {row["stack"] for row in json.loads(out)}
        code, _, err = cli(capsys, "logs", stack)
        assert code == NOT_FOUND and "is down" in err
        history = ClusterStack.select(stack).history()
        assert history[0].kind == "destroy"
        assert history[0].message == (f"skyward: destroyed by {getpass.getuser()}@"
                                      f"{socket.gethostname()}: skyward-iac down --force: "
                                      "a hung owner")
    finally:
        os.kill(owner.process.pid, signal.SIGCONT)


def test_an_unknown_stack_is_exit_code_3(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("down", "logs", "show"):
        code, _, err = cli(capsys, command, "local-nobody-20000101-000000-000000")
        assert code == NOT_FOUND, (command, err)
        assert "no stack named" in err


def wait_for(condition: object, timeout: float, seen: list[str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out; output so far:\n" + "\n".join(seen[-20:]))
        time.sleep(0.05)


@pytest.mark.timeout(600)
def test_a_stacks_dir_cluster_shows_in_ls_history_and_gc_and_gc_leaves_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cluster an ops team runs from stacks/local with the pulumi CLI, in the pools' own
    backend: ``ls`` and ``history`` list it, gc names it skipped and leaves its nodes alone
    (their sandboxes are not orphans), and its destroy shows in ``history``."""
    from skyward_iac.infra.engine import locate as engine
    from tests.helpers import stack_processes
    from tests.integration.test_stacks_dir import LAUNCHERS, pulumi_cli

    found = engine.find_engine()
    base = engine.engine_env(found)
    env = {**os.environ, **base, "PATH": os.pathsep.join([str(LAUNCHERS), base["PATH"]])}
    project = tmp_path / "local"
    shutil.copytree(ROOT / "stacks" / "local", project)
    (project / "Pulumi.ops.yaml").write_text('config:\n  skyward:nodes: "1"\n'
                                             '  skyward:ttl: "0"\n')
    pulumi_cli(project, env, "stack", "init", "ops")
    name, nodes = "skyward-local/ops", "skyward-local-ops"
    try:
        pulumi_cli(project, env, "up", "--yes", "--skip-preview")
        code, out, err = cli(capsys, "ls", "--json")
        assert code == 0, err
        [row] = [r for r in json.loads(out) if r["stack"] == name]
        assert row["managed_by"] == "pulumi CLI (stacks/local)" and row["resources"] >= 2
        code, out, err = cli(capsys, "ls")
        assert name in out and "pulumi CLI (stacks/local)" in out, out
        for dry in (["--dry-run"], []):
            code, out, err = cli(capsys, "gc", *dry, "--json")
            assert code == 0, err
            [action] = [a for a in json.loads(out) if a["stack"] == name]
            assert action["action"] == "skipped" and "pulumi destroy" in action["reason"]
            assert not [a for a in json.loads(out) if nodes in a["stack"]]  # nothing reaped
        assert stack_processes(nodes), "gc stopped the cluster's nodes"
        code, out, err = cli(capsys, "history", "--json")
        [run] = [r for r in json.loads(out) if r["stack"] == name]
        assert run["ended"] == "running" and run["spec"] == "stacks/local"
    finally:
        pulumi_cli(project, env, "destroy", "--yes", "--skip-preview")
    code, out, err = cli(capsys, "history", "--json")
    [run] = [r for r in json.loads(out) if r["stack"] == name]
    assert run["live_resources"] == 0 and run["ended_at"] and run["result"] == "succeeded"
    assert name not in cli(capsys, "ls")[1]
    pulumi_cli(project, env, "stack", "rm", "--yes")
