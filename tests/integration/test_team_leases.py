"""Two machines, one S3 backend: B sees A's pool, B's gc leaves it alone while A renews its lease,
and empties it once A is gone and the lease lapsed. "Machines" are two skyward homes whose
processes run with hostnames of their own (``unshare --uts``, as root)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward_iac.infra.leases import MIN_LEASE
from tests.s3_server import s3_server, team_state_env

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "tests" / "chaos" / "child_pool.py"
BUCKET = "team-leases"
TTL = 5

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a second hostname needs `unshare --uts`, which needs root",
)


def as_host(host: str, command: list[str]) -> list[str]:
    """``command`` run with hostname ``host`` (a UTS namespace of its own)."""
    quoted = " ".join(f"'{part}'" for part in command)
    return ["unshare", "--uts", "sh", "-c", f"hostname {host} && exec {quoted}"]


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[dict[str, dict[str, str]]]:
    """The environments of machine A and machine B: separate homes, one S3 backend on a moto
    server of this test's own (so its traffic never slows another test's server). Secrets use
    a shared passphrase: leases need no KMS, and test_team_backend covers awskms://."""
    with s3_server() as server:
        state = team_state_env(server, BUCKET)
        state.pop("SKYWARD_SECRETS_PROVIDER")
        common = {**os.environ, **state, "PYTHONPATH": str(ROOT),
                  "PULUMI_CONFIG_PASSPHRASE": "team-shared-passphrase"}
        homes = {}
        for machine in ("a", "b"):
            (tmp_path / machine).mkdir()
            homes[machine] = {**common, "SKYWARD_HOME": str(tmp_path / machine)}
        yield homes


def skyward_iac(env: dict[str, str], host: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(as_host(host, [sys.executable, "-m", "skyward_iac.cli", *args]),
                          env=env, capture_output=True, text=True, timeout=150, cwd=ROOT,
                          stdin=subprocess.DEVNULL)


@pytest.mark.timeout(600)
def test_gc_from_another_machine_respects_the_lease(shared: dict[str, dict[str, str]]) -> None:
    a, b = shared["a"], shared["b"]
    owner = subprocess.Popen(as_host("machine-a", [sys.executable, str(CHILD), "1", str(TTL),
                                                   "idle"]),
                             env=a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             cwd=ROOT, stdin=subprocess.DEVNULL, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip() for line in owner.stdout),
                     daemon=True).start()  # type: ignore[union-attr]
    try:
        deadline = time.monotonic() + 180
        while not any(line.startswith("READY ") for line in lines):
            assert owner.poll() is None and time.monotonic() < deadline, "\n".join(lines[-20:])
            time.sleep(0.2)
        stack = next(line for line in lines if line.startswith("READY ")).split()[1]

        listed = skyward_iac(b, "machine-b", "ls", "--json")
        assert listed.returncode == 0, listed.stderr
        assert stack in listed.stdout and "machine-a" in listed.stdout

        time.sleep(TTL + 2)  # A's creation-time expiry has passed; its lease has not
        collected = skyward_iac(b, "machine-b", "gc", "--json")
        assert collected.returncode == 0, collected.stderr
        assert stack not in {a["stack"] for a in json.loads(collected.stdout)
                             if a["action"] == "destroyed"}
        assert owner.poll() is None, "A's pool was disturbed"
        assert not any(re.search(r"destroy|lost|replac", line) for line in lines), lines[-5:]

        os.killpg(owner.pid, signal.SIGKILL)  # A dies without a word
        owner.wait(30)
        started = time.monotonic()
        while True:
            collected = skyward_iac(b, "machine-b", "gc", "--json")
            assert collected.returncode == 0, collected.stderr
            done = [a for a in json.loads(collected.stdout)
                    if a["stack"] == stack and a["action"] == "destroyed"]
            if done:
                break
            assert time.monotonic() - started < MIN_LEASE + 60, "the lease never lapsed"
            time.sleep(5)
        waited = time.monotonic() - started
        assert "lease lapsed" in done[0]["reason"]
        print(f"\nB collected A's stack {waited:.0f}s after A was killed (lease {MIN_LEASE:g}s)")

        history = skyward_iac(b, "machine-b", "history", "--json")
        assert history.returncode == 0 and stack in history.stdout
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
        skyward_iac(a, "machine-a", "gc")  # whatever is left
