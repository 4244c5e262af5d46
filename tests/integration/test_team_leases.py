"""Two machines, one S3 backend: B sees A's pool, B's gc leaves it alone while A renews its lease,
and empties it once A is gone and the lease lapsed, even with B's clock a day ahead. "Machines"
are two skyward homes whose processes run with hostnames of their own (``unshare --uts``, as
root); B's clock runs ahead under libfaketime (its wall clock only: a machine's monotonic clock
is its own anyway)."""

from __future__ import annotations

import glob
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

from skyward_iac.api.deadlines import MAX_CLOCK_SKEW, MIN_LEASE
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


def start_owner(env: dict[str, str]) -> tuple[subprocess.Popen[str], list[str], str]:
    """Machine A's client, its output lines, and its pool's stack once it is ready."""
    owner = subprocess.Popen(as_host("machine-a", [sys.executable, str(CHILD), "1", str(TTL),
                                                   "idle"]),
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             cwd=ROOT, stdin=subprocess.DEVNULL, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip() for line in owner.stdout),
                     daemon=True).start()  # type: ignore[union-attr]
    deadline = time.monotonic() + 180
    while not any(line.startswith("READY ") for line in lines):
        if owner.poll() is not None or time.monotonic() > deadline:
            os.killpg(owner.pid, signal.SIGKILL)
            raise AssertionError("\n".join(lines[-20:]))
        time.sleep(0.2)
    return owner, lines, next(line for line in lines if line.startswith("READY ")).split()[1]


def destroyed(result: subprocess.CompletedProcess[str], stack: str) -> list[dict[str, str]]:
    """What a ``gc --json`` run destroyed of ``stack``."""
    assert result.returncode == 0, result.stderr
    return [a for a in json.loads(result.stdout)
            if a["stack"] == stack and a["action"] == "destroyed"]


@pytest.mark.timeout(600)
def test_gc_from_another_machine_respects_the_lease(shared: dict[str, dict[str, str]]) -> None:
    a, b = shared["a"], shared["b"]
    owner, lines, stack = start_owner(a)
    try:
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
        # B collects a lease after it first sees A's last renewal unchanged, on its own clock;
        # each gc here is 10-15 s (the S3 backend is read through the engine on a busy machine).
        started = time.monotonic()
        while True:
            collected = skyward_iac(b, "machine-b", "gc", "--json")
            assert collected.returncode == 0, collected.stderr
            done = [a for a in json.loads(collected.stdout)
                    if a["stack"] == stack and a["action"] == "destroyed"]
            if done:
                break
            assert time.monotonic() - started < MIN_LEASE + 120, "the lease never lapsed"
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


#: libfaketime, which gives machine B a wall clock that runs ahead (scripts/setup installs it).
FAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))


def ahead(env: dict[str, str], seconds: float) -> dict[str, str]:
    """``env`` for a process whose wall clock runs ``seconds`` ahead; its monotonic clock is
    the machine's own, as on any machine."""
    return {**env, "LD_PRELOAD": FAKETIME[0], "FAKETIME": f"+{seconds:g}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def lease_seen_by(env: dict[str, str], stack: str) -> str:
    """The lease of ``stack`` as B's ``ls`` reads it (a look that B remembers)."""
    listed = skyward_iac(env, "machine-b", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    return str(next(row for row in json.loads(listed.stdout) if row["stack"] == stack)
               ["lease_until"])


@pytest.mark.skipif(not FAKETIME, reason="a clock that runs ahead needs libfaketime, which "
                                         "scripts/setup installs (Debian package libfaketime)")
@pytest.mark.timeout(600)
def test_a_collector_whose_clock_runs_ahead_leaves_a_live_pool_alone(
        shared: dict[str, dict[str, str]]) -> None:
    """Issue 29 finding 3: B's clock 20 s ahead of A's was enough for B's gc to destroy A's live
    pool (a 30 s lease). A first look now allows MAX_CLOCK_SKEW; once B has seen a renewal,
    it judges the lease on its own clock alone: a day ahead takes nothing, and A's death is
    still noticed a lease after B last saw the lease change."""
    a, b = shared["a"], shared["b"]
    owner, lines, stack = start_owner(a)
    try:
        first_look = ahead(b, MAX_CLOCK_SKEW - 60)
        assert not destroyed(skyward_iac(first_look, "machine-b", "gc", "--json"), stack)

        day_ahead = ahead(b, 86400)
        seen = lease_seen_by(day_ahead, stack)
        deadline = time.monotonic() + MIN_LEASE
        while lease_seen_by(day_ahead, stack) == seen:  # B watches A renew once
            assert time.monotonic() < deadline, "A never renewed its lease"
            time.sleep(2)
        assert not destroyed(skyward_iac(day_ahead, "machine-b", "gc", "--json"), stack)
        listed = skyward_iac(day_ahead, "machine-b", "ls")
        assert re.search(rf"{stack}.*held.*\(alive elsewhere\)", listed.stdout), listed.stdout
        assert owner.poll() is None, "A's pool was disturbed"
        assert not any(re.search(r"destroy|lost|replac", line) for line in lines), lines[-5:]

        os.killpg(owner.pid, signal.SIGKILL)  # A dies without a word
        owner.wait(30)
        started = time.monotonic()
        while not (done := destroyed(skyward_iac(day_ahead, "machine-b", "gc", "--json"),
                                     stack)):
            assert time.monotonic() - started < MIN_LEASE + 120, "the lease never lapsed"
            time.sleep(5)
        assert "unrenewed" in done[0]["reason"], done
        print(f"\nB (a day ahead) collected A's stack {time.monotonic() - started:.0f}s after A "
              f"was killed (lease {MIN_LEASE:g}s)")
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
        skyward_iac(a, "machine-a", "gc")  # whatever is left
