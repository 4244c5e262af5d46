"""Every gRPC server skyward_iac starts on the user's machine serves that user only.

Each test runs a real server the way a user's command runs it and makes user ``nobody`` call
it as an attacker would (``grpc_attacker.py``): the language host that ``pulumi preview`` of a
stacks/ project starts; the Automation API's inline-program and engine-events servers that
every pool's ``up`` and ``destroy`` start in the client; the engine's own servers (resource
monitor, engine host), guarded by the file compiled into its gRPC package
(tools/pulumi/same_user_grpc.go.overlay). The dynamic provider host has its own test in
test_engine_safety.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward_iac as sky
from tests.helpers import listening_ports

pytestmark = pytest.mark.chaos
ROOT = Path(__file__).resolve().parents[2]
ATTACKER = Path(__file__).with_name("grpc_attacker.py")
LANGUAGE_HOST = ROOT / "tools" / "pulumi" / "pulumi-language-python"


class Arena:
    """A directory ``nobody`` can use: the ports file it watches and a program that leaves a
    marker when it runs."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="skyward-attack-"))
        self.dir.chmod(0o777)
        self.ports, self.marker = self.dir / "ports", self.dir / "pwned"
        self.ports.write_text("")
        self.ports.chmod(0o666)
        self.program = self.dir / "program"
        self.program.mkdir(mode=0o777)
        (self.program / "__main__.py").write_text(
            f"open({str(self.marker)!r}, 'w').write(str(__import__('os').getuid()))\n")
        self.program.chmod(0o777)
        (self.program / "__main__.py").chmod(0o644)

    def attacker(self) -> subprocess.Popen[str]:
        """User ``nobody``'s attacker, started and ready (the servers live seconds only)."""
        process = subprocess.Popen(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
             str(ATTACKER), str(self.ports), str(self.program)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/",
            env={**os.environ, "PYTHONPATH": ""})
        assert process.stdout is not None
        ready = process.stdout.readline()
        assert ready.strip() == "READY", ready + process.stdout.read()
        return process

    def offer(self, port: int) -> None:
        with self.ports.open("a") as out:
            out.write(f"{port}\n")

    def finish(self, attacker: subprocess.Popen[str]) -> list[str]:
        with self.ports.open("a") as out:
            out.write("end\n")
        out_text, _ = attacker.communicate(timeout=120)
        return out_text.splitlines()


@pytest.fixture
def arena() -> Iterator[Arena]:
    made = Arena()
    yield made
    shutil.rmtree(made.dir, ignore_errors=True)


def test_the_language_host_runs_no_program_for_another_user(arena: Arena) -> None:
    host = subprocess.Popen(
        [str(LANGUAGE_HOST), "127.0.0.1:1"], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PULUMI_PYTHON_CMD": sys.executable})
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        attacker = arena.attacker()
        arena.offer(port)
        lines = arena.finish(attacker)
        assert f"{port} run REFUSED PERMISSION_DENIED" in lines, lines
        assert f"{port} events REFUSED UNIMPLEMENTED" in lines, lines  # not its service
        assert not arena.marker.exists(), "the language host ran another user's program"
        # The owner's own call goes through and runs the program: the refusal above is the
        # guard's, not a malformed request's.
        owner = subprocess.run(
            [sys.executable, str(ATTACKER), str(arena.ports), str(arena.program)],
            capture_output=True, text=True, timeout=120, check=False)
        assert f"{port} run REFUSED PERMISSION_DENIED" not in owner.stdout, owner.stdout
        assert arena.marker.read_text() == str(os.getuid()), owner.stdout + owner.stderr
    finally:
        host.kill()
        host.wait()


def engine_processes(parent: int) -> list[int]:
    """The Pulumi engines that process ``parent`` runs now."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit()
                    and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent
                    and (proc / "cmdline").read_bytes().split(b"\0")[0].endswith(b"/pulumi")):
                found.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def test_a_pools_servers_refuse_another_user(arena: Arena) -> None:
    attacker = arena.attacker()
    offered: dict[int, str] = {}
    stop = threading.Event()

    def offer_new_ports() -> None:
        # These servers live only while an engine command runs.
        while not stop.is_set():
            owners = {os.getpid(): "client", **dict.fromkeys(engine_processes(os.getpid()),
                                                             "engine")}
            for pid, owner in owners.items():
                for port in listening_ports(pid) - offered.keys():
                    offered[port] = owner
                    arena.offer(port)
            time.sleep(0.002)

    spotter = threading.Thread(target=offer_new_ports)
    spotter.start()
    try:
        with sky.Compute(provider=sky.Local(), nodes=1, options=sky.Options(console=False)):
            pass
    finally:
        stop.set()
        spotter.join()
    lines = arena.finish(attacker)
    assert set(offered.values()) == {"client", "engine"}, offered
    assert not [line for line in lines if "ACCEPTED" in line], lines
    refused = {(offered[int(line.split()[0])], line.split()[1]) for line in lines
               if line.endswith("REFUSED PERMISSION_DENIED")}
    # Every kind was reached and refused by a guard: the client's program runner and events
    # sink, the engine's resource monitor and its log sink.
    assert refused == {("client", "run"), ("client", "events"),
                       ("engine", "monitor"), ("engine", "log")}, lines
    assert not arena.marker.exists()
