"""Two machines, one S3 backend (moto): B's ``history --json`` row for A's run says who ran it,
what and where (instance type, region, market), its node-hours and USD so far, and after A's
pool ended, how and by whom; ``cost`` from B counts A's run under A's user; and the engine's
own update history of A's stack names the actor of every update. "Machines" as in
test_team_leases.py: two skyward homes, two hostnames (``unshare --uts``)."""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
from typing import Any

import pytest

from skyward_iac.infra.engine import locate as engine
from tests.integration.test_team_leases import (  # noqa: F401 - `shared` is a fixture
    ROOT,
    as_host,
    shared,
    skyward_iac,
    start_owner,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a second hostname needs `unshare --uts`, which needs root")

RATE = 0.5  # USD per node-hour of A's Local node


def row(env: dict[str, str], stack: str) -> dict[str, Any]:
    """B's ``history --json`` row for ``stack``."""
    listed = skyward_iac(env, "machine-b", "history", "--json")
    assert listed.returncode == 0, listed.stderr
    [found] = [r for r in json.loads(listed.stdout) if r["stack"] == stack]
    return dict(found)


@pytest.mark.timeout(900)
def test_a_teammates_history_says_who_what_where_and_how_much(
        shared: dict[str, dict[str, str]]) -> None:  # noqa: F811
    a = {**shared["a"], "SKYWARD_TEST_USD_PER_HOUR": str(RATE)}
    b = {**shared["b"], "USER": "bo", "LOGNAME": "bo"}
    user = a.get("USER") or getpass.getuser()
    owner, _lines, stack = start_owner(a)
    try:
        live = row(b, stack)
        for field in ("instance_type", "region", "market", "actor"):
            assert live[field], (field, live)
        assert (live["instance_type"], live["region"], live["market"]) == ("local", "local",
                                                                           "on-demand")
        assert live["actor"] == f"{user}@machine-a" and live["actor_source"] == "self-declared"
        assert live["ended"] == "running" and live["live_resources"] > 0
        assert live["node_hours"] > 0 and live["cost_usd"] == pytest.approx(
            RATE * live["node_hours"], abs=1e-4)

        costs = skyward_iac(b, "machine-b", "cost", "--json", "--by", "user")
        assert costs.returncode == 0, costs.stderr
        groups = {g["group"]: g for g in json.loads(costs.stdout)["groups"]}
        assert groups[f"{user}@machine-a"]["runs"] == 1
        assert "bo@machine-b" not in groups  # B ran nothing

        os.killpg(owner.pid, signal.SIGINT)  # A's user presses Ctrl+C: the pool ends there
        assert owner.wait(300) != 0
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait(30)
            skyward_iac(a, "machine-a", "gc")

    ended = row(b, stack)
    assert ended["live_resources"] == 0 and ended["ended_at"], ended
    assert "Ctrl+C" in ended["ended"] and f"{user}@machine-a" in ended["ended"], ended
    assert ended["destroys"][0]["result"] == "succeeded"
    assert ended["node_hours"] >= live["node_hours"] > 0
    assert ended["cost_usd"] == pytest.approx(RATE * ended["node_hours"], abs=1e-4)

    # Plain `pulumi stack history`, run on B, is an audit trail of its own.
    found = engine.find_engine()
    shown = subprocess.run(
        as_host("machine-b", [str(found.binary), "stack", "history", "--stack",
                              f"organization/skyward/{stack}", "--json"]),
        check=False, capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**b, "PULUMI_BACKEND_URL": b["SKYWARD_BACKEND_URL"],
             "PULUMI_HOME": os.path.join(b["SKYWARD_HOME"], "pulumi-home"),
             "PULUMI_SKIP_UPDATE_CHECK": "true", "PATH": f"{found.binary.parent}:"
                                                          f"{os.environ['PATH']}"})
    assert shown.returncode == 0, shown.stderr
    messages = [u["message"] for u in json.loads(shown.stdout)]
    assert messages, shown.stdout
    assert all(f"{user}@machine-a" in m for m in messages), messages
