"""The client's heartbeat over the agent connection (``Beat``), against a real agent and a real
watchdog: the agent writes the files the SFTP beats write, so the watchdog (unchanged) is kept
satisfied by beats that travel with the tasks, and stops the node when they stop."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from skyward_iac.node import protocol
from skyward_iac.node.messages import Beat
from skyward_iac.remote.agent_client import AgentClient
from tests.agent_process import TOKEN, running, running_agent, wait_until


def test_a_beat_is_written_where_the_watchdog_reads_the_budget_first(tmp_path: Path) -> None:
    heartbeat, budget = tmp_path / "heartbeat", tmp_path / "budget"
    with running_agent(tmp_path, "--heartbeat", str(heartbeat)) as agent:
        client = AgentClient(agent.connect(), TOKEN, 0)
        try:
            client.send(Beat(1, "120.0"))
            assert wait_until(lambda: heartbeat.exists() and heartbeat.read_text() == "beat 1\n",
                              10)
            assert budget.read_text() == "120.0"
            budget_state = budget.stat().st_mtime_ns
            client.send(Beat(2))  # no note: the budget file is left as it is
            assert wait_until(lambda: heartbeat.read_text() == "beat 2\n", 10)
            assert budget.stat().st_mtime_ns == budget_state
        finally:
            client.close()


def test_an_agent_started_without_a_heartbeat_file_ignores_beats(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        client = AgentClient(agent.connect(), TOKEN, 0)
        try:
            client.send(Beat(1, "60"))
            # The connection goes on serving tasks.
            assert client.submit("pow", protocol.dumps((pow, (3, 2), {})),
                                 timeout=30).result(30) == 9
        finally:
            client.close()
    assert not (tmp_path / "heartbeat").exists() and not (tmp_path / "budget").exists()


def test_beats_over_the_agent_keep_the_watchdog_satisfied_and_their_end_stops_the_node(
        tmp_path: Path) -> None:
    ttl = 4
    sandbox = tmp_path / "node"
    sandbox.mkdir()
    heartbeat = sandbox / "heartbeat"
    with running_agent(sandbox, "--heartbeat", str(heartbeat)) as agent:
        watchdog = subprocess.Popen(
            [sys.executable, "-m", "skyward_iac.node", "watchdog", "--heartbeat", str(heartbeat),
             "--ttl", str(ttl), "--sandbox", str(sandbox)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = AgentClient(agent.connect(), TOKEN, 0)
        try:
            count = 0
            beating_until = time.monotonic() + 2 * ttl
            while time.monotonic() < beating_until:  # two ttls: the watchdog would have acted
                count += 1
                client.send(Beat(count))
                time.sleep(0.5)
            assert running(agent.pid) and watchdog.poll() is None, "beats did not reach it"
            # Silence: the watchdog stops the node (its sandbox's processes, the agent first).
            assert wait_until(lambda: not running(agent.pid), ttl + 20), \
                "the node outlived its silent client"
            assert watchdog.wait(20) is not None
        finally:
            client.close()
            if watchdog.poll() is None:
                watchdog.kill()
                watchdog.wait(10)
