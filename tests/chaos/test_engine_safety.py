"""The engine and its dynamic providers on a real Local stack: another user cannot drive a
running provider, no provider outlives its engine, and Ctrl+C during a destroy never leaves a
stack nobody can read."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import pytest

import skyward_iac as sky
from skyward_iac.infra.stacks.stack import ClusterStack
from tests.chaos.test_lifecycle_chaos import ROOT, Child, skyward_iac, wait_until_gone
from tests.helpers import listening_ports, stored_resource_count

pytestmark = pytest.mark.chaos
ATTACKER = Path(__file__).with_name("provider_attacker.py")


def provider_processes() -> list[int]:
    """This session's dynamic-provider processes (ours and the SDK's own): those of this
    home, which they inherit from the engine (another pytest worker's are not ours)."""
    marker = os.environ["SKYWARD_HOME"].encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
                if not (b"skyward_iac.infra.provider_host" in cmdline
                        or b"-m\x00pulumi.dynamic" in cmdline):
                    continue
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ or marker in cmdline:
                found.append(int(proc.name))
    return found


def listening_port(pid: int) -> int | None:
    """A TCP port process ``pid`` listens on (a provider listens on one)."""
    return min(listening_ports(pid), default=None)


def test_a_running_provider_refuses_another_users_calls_and_runs_nothing() -> None:
    # A directory the attacker (nobody) can reach: it reads the port, and its pickle would
    # write the marker (pytest's own tmp directories are private to root).
    shared = Path(tempfile.mkdtemp(prefix="skyward-attack-"))
    shared.chmod(0o777)
    port_file, marker = shared / "port", shared / "pwned"
    port_file.write_text("")
    port_file.chmod(0o666)
    attacker = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
         str(ATTACKER), str(port_file), str(marker)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/",
        env={**os.environ, "PYTHONPATH": ""})
    owner_answer: list[str] = []

    def spot_the_provider() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for pid in provider_processes():
                if (port := listening_port(pid)) is not None:
                    owner_answer.append(_call_as_owner(port))
                    port_file.write_text(str(port))
                    return
            time.sleep(0.005)

    # The attacker's imports can take seconds on a loaded machine; a provider lives only while
    # its engine runs, so the pool starts once the attacker is ready to call at once.
    ready, waited = Path(f"{port_file}.ready"), time.monotonic() + 120
    while not ready.exists() and attacker.poll() is None and time.monotonic() < waited:
        time.sleep(0.05)
    assert ready.exists(), "the attacker never got ready"
    spotter = threading.Thread(target=spot_the_provider)
    spotter.start()
    with sky.Compute(provider=sky.Local(), nodes=4, options=sky.Options(console=False)):
        pass
    spotter.join()
    out, _ = attacker.communicate(timeout=60)
    assert owner_answer and owner_answer[0] == "OK", owner_answer  # the guard lets us in
    assert out.strip().startswith("REFUSED PERMISSION_DENIED"), out
    assert not marker.exists(), "the provider ran the attacker's pickle"
    shutil.rmtree(shared)


def _call_as_owner(port: int) -> str:
    """A harmless call from this (the owning) user, proving the port and the guard work."""
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import provider_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            provider_pb2_grpc.ResourceProviderStub(channel).GetPluginInfo(
                empty_pb2.Empty(), timeout=10)
        except grpc.RpcError as exc:
            return exc.code().name
    return "OK"


@pytest.mark.parametrize("victim", ["client", "engine"])
def test_no_provider_outlives_its_engine(victim: str) -> None:
    before = set(provider_processes())
    child = Child(nodes=4, ttl=30, mode="idle")
    deadline = time.monotonic() + 120
    while not (set(provider_processes()) - before):
        assert time.monotonic() < deadline, "no provider process appeared"
        assert child.process.poll() is None, child.lines[-20:]
        time.sleep(0.01)
    if victim == "client":
        child.signal(signal.SIGKILL)
    else:
        engines = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                   and _parent(int(p.name)) == child.process.pid
                   and b"pulumi" in _cmdline(int(p.name))]
        for pid in engines:
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while set(provider_processes()) - before:
        assert time.monotonic() < deadline, f"providers outlived the {victim}"
        time.sleep(0.1)
    child.signal(signal.SIGKILL)
    child.finish()
    if child.stack:  # what the killed client left: gc empties it once its ttl has passed
        deadline = time.monotonic() + 120
        while stored_resource_count(child.stack):
            assert time.monotonic() < deadline, "gc never emptied the stack"
            assert skyward_iac("gc").returncode == 0
            time.sleep(5)
        assert ClusterStack.select(child.stack).resource_count() == 0
        wait_until_gone(child.stack, 30)


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_ctrl_c_during_destroy_never_leaves_an_unreadable_stack() -> None:
    runs = 5  # each run checks the policy (the engine never sees the Ctrl+C); 10 took 3.5 min
    for _ in range(runs):
        child = Child(nodes=2, ttl=30, mode="exit")
        child.wait_for(r"destroying")
        time.sleep(0.3)  # well into the destroy
        child.signal(signal.SIGINT)
        child.finish()
        assert child.stack
        assert any("the destroy under way goes on" in line for line in child.lines), \
            child.lines[-15:]
        stack = ClusterStack.select(child.stack)  # readable: no "failed to load checkpoint"
        assert stack.resource_count() == 0, "the destroy was cut short"
        wait_until_gone(child.stack, 30)
    listing = subprocess.run([str(Path(sys.executable).parent / "skyward-iac"), "history",
                              "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                             check=False)
    assert listing.returncode == 0, listing.stderr
    assert not provider_processes()
