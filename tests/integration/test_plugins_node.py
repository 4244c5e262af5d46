"""Plugins inside a real agent process and its workers (no pool): composition on the node, and
a failing node-side hook reported by every task with the plugin's name."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.node import protocol
from skyward_iac.plugins import LaunchCommand, LaunchContext, Plugin
from skyward_iac.plugins._client import node_plugins
from skyward_iac.remote.agent_client import AgentClient

pytestmark = pytest.mark.integration
TOKEN = "plugin-test-token"
INSTANCE = {"node": 0, "total_nodes": 2, "head_addr": "127.0.0.1", "head_port": 2379,
            "job_id": "local-test-plugins", "peers": [], "workers_per_node": 2}


@contextlib.contextmanager
def agent(tmp_path: Path, *flags: str) -> Iterator[AgentClient]:
    """A real agent process on loopback, connected and authenticated."""
    (tmp_path / "token").write_text(TOKEN)
    process = subprocess.Popen(
        [sys.executable, "-m", "skyward_iac.node", "agent", "--token-file", str(tmp_path / "token"),
         "--port-file", str(tmp_path / "port"), *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "port").exists():
            assert time.monotonic() < deadline and process.poll() is None, "agent did not start"
            time.sleep(0.05)
        sock = socket.create_connection(("127.0.0.1", int((tmp_path / "port").read_text())))
        client = AgentClient(sock, TOKEN, node=0)
        try:
            yield client
        finally:
            client.close()
    finally:
        process.terminate()
        process.wait(10)


def run(client: AgentClient, fn: Any, *args: Any) -> Any:
    return client.submit(fn.__name__, protocol.dumps((fn, args, {})), timeout=30).result(30)


def worker_view(pause: float = 0.0) -> dict[str, Any]:
    time.sleep(pause)
    info = sky.instance_info()
    return {"worker": info.worker if info else None, "launch": os.environ.get("LAUNCHED"),
            "pid": os.getpid()}


def launched(command: LaunchCommand, context: LaunchContext) -> LaunchCommand:
    return command.with_env(LAUNCHED=f"{context.worker}/{context.instance.workers_per_node}")


def test_process_workers_get_their_index_and_launch(tmp_path: Path) -> None:
    plugins = node_plugins([Plugin.create("launch").with_launcher(launched)])
    with agent(tmp_path, "--concurrency", "2", "--executor", "process") as client:
        client.configure(INSTANCE, None, plugins)
        # Two slow tasks at once occupy both worker processes.
        futures = [client.submit("view", protocol.dumps((worker_view, (1.0,), {})), timeout=30)
                   for _ in range(2)]
        by_pid = {view["pid"]: view for view in (f.result(30) for f in futures)}
    assert sorted((v["worker"], v["launch"]) for v in by_pid.values()) == [(0, "0/2"), (1, "1/2")]


@contextlib.contextmanager
def broken_app(info: sky.InstanceInfo) -> Iterator[None]:
    raise OSError("the GPU is not there")
    yield


@contextlib.contextmanager
def broken_process(info: sky.InstanceInfo) -> Iterator[None]:
    raise KeyError("MASTER_ADDR")
    yield


@pytest.mark.parametrize(("plugin", "message"), [
    (Plugin.create("gpu-check").with_around_app(broken_app),
     "plugin 'gpu-check' failed in its around_app hook: OSError: the GPU is not there"),
    (Plugin.create("env-check").with_around_process(broken_process),
     "plugin 'env-check' failed in its around_process hook: KeyError: 'MASTER_ADDR'"),
])
def test_a_failing_node_hook_fails_every_task_naming_the_plugin(
        tmp_path: Path, plugin: Plugin, message: str) -> None:
    with agent(tmp_path) as client:
        client.configure(INSTANCE, None, node_plugins([plugin]))
        for _ in range(2):
            with pytest.raises(sky.PluginError) as failure:
                run(client, worker_view)
            assert message in str(failure.value)
