"""A stack's whole life on the Local provider, with the real engine, sshd and agents."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest

import skyward_iac as sky
from skyward_iac.infra.engine import locate as engine
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.stack import ClusterStack
from tests.helpers import stack_processes, stack_sandboxes


@sky.function
def ping() -> str:
    return "pong"


def assert_gone(stack_name: str) -> None:
    assert stack_processes(stack_name) == [], "a process of the stack outlived it"
    assert stack_sandboxes(stack_name) == [], "a sandbox of the stack outlived it"
    assert ClusterStack.select(stack_name).resource_count() == 0


@dataclass(frozen=True)
class Finished:
    """What one Local pool showed while it lived; it was destroyed when the fixture returned."""

    stack: str
    reply: str
    sandboxes: int
    processes: list[int]
    resources: int


@pytest.fixture(scope="module")
def finished() -> Finished:
    """One pool's whole life (up, a call, exit, destroy), whose record the tests below read:
    they only read it, so one pool serves them (``tests/scheduling.py``: this file is one unit)."""
    compute = sky.Compute(provider=sky.Local(), nodes=1, ttl=120)
    with compute as pool:
        name = pool.stack_name
        return Finished(name, ping() >> pool, len(stack_sandboxes(name)), stack_processes(name),
                        ClusterStack.select(name).resource_count())


def test_up_then_destroy_leaves_nothing_and_keeps_history(finished: Finished) -> None:
    name = finished.stack
    assert finished.reply == "pong"
    assert finished.sandboxes == 1
    assert finished.processes, "expected the node's sshd and agent to be running"
    assert finished.resources == 3  # credentials, etcd PKI, one node
    assert_gone(name)

    stack = ClusterStack.select(name)
    kinds = [(u.kind, u.result) for u in stack.history()]
    assert kinds == [("destroy", "succeeded"), ("update", "succeeded")]
    tags = stack.tags()
    assert tags["provider"] == "local" and tags["nodes"] == "1" and tags["ttl"] == "120"
    assert {"owner", "created_at", "expires_at", "version"} <= tags.keys()

    # The same history through the pulumi CLI against the same backend (what ops would run).
    found = engine.find_engine()
    cli = subprocess.run(
        [str(found.binary), "stack", "history", "--json", "-s", f"organization/skyward/{name}"],
        cwd=home.workspace_dir(), env={**engine.engine_env(found)}, capture_output=True,
        text=True, timeout=60, check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert [u["kind"] for u in json.loads(cli.stdout)] == ["destroy", "update"]


def test_exception_inside_the_block_still_destroys_the_stack() -> None:
    compute = sky.Compute(provider=sky.Local(), nodes=1)
    with pytest.raises(RuntimeError, match="user code failed"), compute as pool:
        assert (ping() >> pool) == "pong"
        raise RuntimeError("user code failed")
    assert_gone(compute.stack_name)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nodes": 0}, "nodes: nodes must be at least 1"),
        ({"accelerator": "A100"}, "sky.accelerators.A100(), not the string 'A100'"),
        ({"ttl": -5}, "ttl: ttl must be >= 0"),
        ({"provider": "local"}, "not the string 'local'"),
    ],
)
def test_invalid_spec_is_rejected_before_anything_is_provisioned(
    fields: dict, message: str
) -> None:
    before = sorted(home.state_dir().rglob("*")), sorted(home.local_nodes_dir().iterdir())
    with pytest.raises(sky.ConfigError) as caught:
        sky.Compute(**{"provider": sky.Local(), **fields})
    assert message in str(caught.value)
    assert (sorted(home.state_dir().rglob("*")), sorted(home.local_nodes_dir().iterdir())) == before


def test_cli_show_lists_a_destroyed_stack_history(finished: Finished) -> None:
    from skyward_iac import cli

    out = subprocess.run(
        [sys.executable, "-m", "skyward_iac.cli", "show", finished.stack, "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    report = json.loads(out)
    assert report["resources"] == 0
    assert [u["kind"] for u in report["updates"]] == ["destroy", "update"]
    assert report["updates"][1]["changes"] == {"create": 4}
    assert report["updates"][0]["changes"] == {"delete": 4}
    from skyward_iac.cli_commands.live import NOT_FOUND

    assert cli.main(["show", "no-such-stack"]) == NOT_FOUND
