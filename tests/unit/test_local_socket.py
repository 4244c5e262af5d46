"""A Local node's same-host path (node/local_socket.py, remote/data_port.py) against a real
agent process: a Unix socket mode 0600 in its workdir, however long the workdir's path, whose
peers of another uid are refused by the uid check itself; and the client's choice of path."""

from __future__ import annotations

import os
import pickle
import shutil
import stat
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skyward_iac.node import local_socket, protocol
from skyward_iac.remote import data_port
from skyward_iac.remote.agent_client import AgentClient
from skyward_iac.remote.bootstrap import LOCAL_SOCKET_FILE, DataPortPlan
from tests.agent_process import TOKEN, Agent, closed_without_greeting, running_agent, wait_until

#: Sends the token frame (hex, argv[2]) over the Unix socket named by argv[1] (as user
#: nobody), then prints what the agent answers: b'' when it closed the connection unanswered.
_AS_ANOTHER_USER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(sys.argv[1])
try:
    s.sendall(bytes.fromhex(sys.argv[2]))
    print(repr(s.recv(100)))
except (ConnectionResetError, BrokenPipeError):
    print("reset")
"""


def _as_nobody(script: str, *args: str) -> dict[str, Any]:
    """``subprocess`` arguments running ``python -c script args`` as user nobody."""
    return {"args": ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                     sys.executable, "-c", script, *args],
            "text": True, "cwd": "/", "env": {**os.environ, "PYTHONPATH": ""}}


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory user nobody can reach (pytest's own tmp_path is private to us)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another user")
    directory = Path(tempfile.mkdtemp(prefix="skyward-local-socket-", dir="/tmp"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _long_workdir(root: Path) -> Path:
    """A workdir whose socket path is well over ``sun_path``'s 107 bytes."""
    workdir = root / ("a-long-local-node-sandbox-directory-" * 4) / "work"
    workdir.mkdir(parents=True)
    assert len(os.fsencode(workdir / LOCAL_SOCKET_FILE)) > local_socket.MAX_ADDRESS
    return workdir


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    workdir = _long_workdir(tmp_path_factory.mktemp("local-socket"))
    with running_agent(workdir, "--local-socket", str(workdir / LOCAL_SOCKET_FILE)) as started:
        yield started


def test_the_socket_is_private_to_the_user_even_at_a_long_path(agent: Agent) -> None:
    path = agent.workdir / LOCAL_SOCKET_FILE
    mode = os.lstat(path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert os.lstat(path).st_uid == os.geteuid()


def test_the_client_runs_tasks_and_large_buffers_over_the_local_socket(agent: Agent) -> None:
    sock = data_port.connect_local(agent.workdir / LOCAL_SOCKET_FILE)
    client = AgentClient(sock, TOKEN, node=0)
    try:
        assert client.submit("pow", protocol.dumps((pow, (3, 4), {})), timeout=60).result(60) == 81
        data = os.urandom(8 << 20)
        # An out-of-band buffer: relayed into the worker as it arrives over the Unix socket.
        packed = protocol.dumps((zlib.crc32, (pickle.PickleBuffer(bytearray(data)),), {}))
        assert client.submit("crc", packed, timeout=60).result(60) == zlib.crc32(data)
    finally:
        client.close()


def test_a_connection_without_the_token_is_refused_and_logged(agent: Agent) -> None:
    with local_socket.connect(agent.workdir / LOCAL_SOCKET_FILE, 10) as sock:
        protocol.Channel(sock).send_raw(b"not the token")
        assert closed_without_greeting(sock)
    assert wait_until(lambda: "from the local socket" in (agent.workdir / "agent.log").read_text(),
                      10)


def test_a_peer_of_another_uid_is_refused_by_the_uid_check(reachable: Path) -> None:
    # A workdir that user nobody can reach, and a socket whose mode lets it connect: only
    # the agent's SO_PEERCRED check stands between it and the agent.
    path = reachable / "agent.sock"
    with running_agent(reachable, "--local-socket", str(path)):
        path.chmod(0o666)
        frame = protocol.HEADER.pack(len(TOKEN), protocol.RAW) + TOKEN.encode()
        done = subprocess.run(**_as_nobody(_AS_ANOTHER_USER, str(path), frame.hex()),
                              capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr  # it did connect: the modes let it
        assert done.stdout.strip() in ("b''", "reset"), done.stdout
        log = reachable / "agent.log"
        assert wait_until(lambda: "on the local socket (not the agent's user)"
                          in log.read_text(), 10), log.read_text()
        # And the agent still serves its own user.
        client = AgentClient(data_port.connect_local(path), TOKEN, node=0)
        try:
            assert client.submit("pow", protocol.dumps((pow, (2, 5), {})),
                                 timeout=60).result(60) == 32
        finally:
            client.close()


def test_a_stale_socket_is_replaced_and_anything_else_refused(tmp_path: Path) -> None:
    long_dir = _long_workdir(tmp_path)
    path = long_dir / "agent.sock"
    first = local_socket.bind(path)
    first.close()  # an agent gone: its socket file stays
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    with pytest.raises(ConnectionRefusedError):
        local_socket.connect(path, 5)
    second = local_socket.bind(path)
    try:
        with local_socket.connect(path, 5) as sock:
            accepted, _ = second.accept()
            with accepted:
                assert local_socket.peer_credentials(accepted)[1:] == (os.geteuid(),
                                                                       os.getegid())
                assert local_socket.peer_credentials(sock)[0] == os.getpid()
    finally:
        second.close()
    path.unlink()
    path.write_text("not a socket")
    with pytest.raises(FileExistsError):
        local_socket.bind(path)
    assert path.read_text() == "not a socket"


def test_the_client_refuses_a_socket_served_by_another_uid(reachable: Path) -> None:
    reachable.chmod(0o777)  # nobody plants its socket here
    path = reachable / "planted.sock"
    serve = ("import socket, sys, time\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "s.bind(sys.argv[1]); s.listen(1); print('ready', flush=True)\n"
             "c, _ = s.accept(); time.sleep(10)\n")
    planted = subprocess.Popen(**_as_nobody(serve, str(path)), stdout=subprocess.PIPE)
    try:
        assert planted.stdout is not None and planted.stdout.readline().strip() == "ready"
        with pytest.raises(PermissionError, match="served by uid"):
            data_port.connect_local(path)
    finally:
        planted.kill()
        planted.wait()


def test_the_path_chosen_with_a_local_socket_says_why() -> None:
    local = Path("/w/run/agent.sock")
    refused = ConnectionRefusedError("refused")
    # No local socket (a cloud node): the data port's policy, unchanged.
    assert data_port.choose_path(4000, None) == (data_port.DATA_PORT, "mutual TLS on port 4000")
    assert data_port.choose_path(None, None)[0] == data_port.SSH_TUNNEL
    # A local socket that answers wins, whatever the data port.
    for port, error in ((None, None), (4000, None), (4000, refused)):
        path, why = data_port.choose_path(port, error, local)
        assert path == data_port.LOCAL_SOCKET and str(local) in why
    # One that fails, or is turned off: the data port, then the tunnel, saying so.
    gone = FileNotFoundError("no such file")
    path, why = data_port.choose_path(4000, None, local, gone)
    assert path == data_port.DATA_PORT and "no such file" in why and "4000" in why
    path, why = data_port.choose_path(4000, refused, local, gone)
    assert path == data_port.SSH_TUNNEL and "refused" in why and "no such file" in why
    path, why = data_port.choose_path(None, None, local, gone)
    assert path == data_port.SSH_TUNNEL and "no data port" in why and "no such file" in why
    path, why = data_port.choose_path(4000, None, local, None, local_off=True)
    assert path == data_port.DATA_PORT and data_port.LOCAL_SOCKET_ENV in why
    path, why = data_port.choose_path(None, None, local, None, local_off=True)
    assert path == data_port.SSH_TUNNEL and data_port.LOCAL_SOCKET_ENV in why
    # SSH is not needed to carry the local socket: only the head's collections tunnel keeps it.
    assert not data_port.keeps_ssh(data_port.LOCAL_SOCKET, carries_collections=False)
    assert data_port.keeps_ssh(data_port.LOCAL_SOCKET, carries_collections=True)


def test_the_local_socket_is_wanted_unless_turned_off() -> None:
    assert data_port.local_socket_wanted({})
    assert data_port.local_socket_wanted({data_port.LOCAL_SOCKET_ENV: "1"})
    for off in ("0", "false", "No", " off "):
        assert not data_port.local_socket_wanted({data_port.LOCAL_SOCKET_ENV: off})


def test_only_a_same_host_plan_names_a_local_socket() -> None:
    plan = DataPortPlan("127.0.0.1", "ca", "cert", "key")
    assert data_port.local_socket_of("/w", plan) is None
    assert data_port.local_socket_of("/w", None) is None
    same_host = DataPortPlan("127.0.0.1", "ca", "cert", "key", local_socket=True)
    assert data_port.local_socket_of("/w", same_host) == Path("/w") / LOCAL_SOCKET_FILE
