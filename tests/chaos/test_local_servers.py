"""Every gRPC server skyward_iac starts on the user's machine serves that user only.

Each test runs a real server the way a user's command runs it and makes user ``nobody`` call
it as an attacker would (``grpc_attacker.py``): the language host that ``pulumi preview`` of a
stacks/ project starts, and the Automation API's inline-program and engine-events servers that
every pool's ``up`` and ``destroy`` start in the client. The dynamic provider host has its own
test in test_engine_safety.py.
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
        return subprocess.Popen(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
             str(ATTACKER), str(self.ports), str(self.program)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/",
            env={**os.environ, "PYTHONPATH": ""})

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
            capture_output=True, text=True, timeout=120)
        assert f"{port} run REFUSED PERMISSION_DENIED" not in owner.stdout, owner.stdout
        assert arena.marker.read_text() == str(os.getuid()), owner.stdout + owner.stderr
    finally:
        host.kill()
        host.wait()


def test_a_pools_automation_servers_refuse_another_user(arena: Arena) -> None:
    attacker = arena.attacker()
    offered: set[int] = set()
    stop = threading.Event()

    def offer_new_ports() -> None:
        # The inline program's and the events' servers live only while an engine command runs.
        while not stop.is_set():
            for port in listening_ports(os.getpid()) - offered:
                offered.add(port)
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
    assert offered, "no server of this process was seen during up and destroy"
    assert not [line for line in lines if "ACCEPTED" in line], lines
    refused = {line.split()[1] for line in lines if line.endswith("REFUSED PERMISSION_DENIED")}
    # Both kinds were reached and refused by the guard: the program runner and the events sink.
    assert refused == {"run", "events"}, lines
    assert not arena.marker.exists()
