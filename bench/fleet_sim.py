"""A fleet of simulated nodes in one process, for figure 7 (a thousand nodes on one machine).

Each node is an SSH server of its own (asyncssh: its own port on 127.0.0.1, its own ed25519
host key, the stack's client key the only one accepted) and, behind it, an agent that speaks
the real wire protocol: the client's raw token frame first (checked as the agent checks it:
RAW, at most ``MAX_TOKEN_FRAME`` bytes, compared in constant time), the real ``Welcome``, then
``Configure``, ``Task`` batches and ``Cancel`` read by ``protocol.read_message``, each task run
by the worker's own ``run_task`` and its ``Result`` sent back, one frame per frame received.
Every node also serves SFTP in a directory of its own, where the client's heartbeat writes.
All of it runs on one asyncio event loop: nothing per node but sockets and objects.

What a client meets here is what it meets on a real node: TCP, an SSH handshake with a pinned
host key and public-key authentication, a ``direct-tcpip`` channel to the agent's port, an SFTP
channel, and the agent's frames. What is SKIPPED: the stack (no Pulumi engine), the bootstrap
(no uv, venv or packages), one OpenSSH ``sshd`` per node (asyncssh in this process instead),
the agent's worker processes and slots (tasks run inline, one after another, in this event
loop: no process hop, no output streaming, no metrics, no preemption watcher), and etcd (no
collections).

Run: python bench/fleet_sim.py --nodes N --fleet-file F [--root DIR]. F (JSON, mode 0600: it
holds the client's key and the token) is written once every node listens; the simulator then
serves until its standard input closes, so it never outlives the process that started it, and
writes what it served (tasks, and the frames that brought them) beside F, as F.stats.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hmac
import json
import os
import resource
import secrets
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncssh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skyward_iac.collections.pki import generate_cluster_certificates
from skyward_iac.node import data_port, protocol
from skyward_iac.node.etcd_server import write_certificates
from skyward_iac.node.messages import Configure, Task, Welcome
from skyward_iac.node.worker import run_task

#: The agent's port on every simulated node's loopback (a real agent picks a free one).
AGENT_PORT = 7070
SSH_USER = "skyward"


class FrameBuffer:
    """Bytes as they arrive on a channel; whole frames out, measured by the real header layout
    (``protocol.HEADER``, then for a frame with out-of-band buffers their count and sizes)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def whole_frame(self) -> int | None:
        """The length of the first frame once all of it is here, else None."""
        data, header = self.data, protocol.HEADER
        if len(data) < header.size:
            return None
        size, flags = header.unpack_from(data)
        end = header.size + size
        if not flags & protocol.BUFFERS:
            return end if len(data) >= end else None
        if len(data) < end + protocol.COUNT.size:
            return None
        (count,) = protocol.COUNT.unpack_from(data, end)
        if count > protocol.MAX_BUFFERS:
            raise protocol.ProtocolError(f"a frame announces {count} buffers")
        table = end + protocol.COUNT.size
        if len(data) < table + protocol.SIZE.size * count:
            return None
        total = table + protocol.SIZE.size * count + sum(
            protocol.SIZE.unpack_from(data, table + i * protocol.SIZE.size)[0]
            for i in range(count))
        return total if len(data) >= total else None

    def take(self, length: int) -> Received:
        frame = Received(bytes(self.data[:length]))
        del self.data[:length]
        return frame


class Received:
    """One whole frame as a ``protocol.ByteStream``, so the real readers parse it."""

    def __init__(self, data: bytes) -> None:
        self.view, self.at = memoryview(data), 0

    def recv(self, size: int) -> bytes:
        chunk = bytes(self.view[self.at:self.at + size])
        self.at += len(chunk)
        return chunk

    def recv_into(self, target: memoryview, size: int) -> int:
        chunk = self.view[self.at:self.at + min(size, len(target))]
        target[:len(chunk)] = chunk
        self.at += len(chunk)
        return len(chunk)

    def sendall(self, data: bytes | memoryview) -> None:
        raise OSError("a received frame is read only")


class SimulatedAgent(asyncssh.SSHTCPSession[bytes]):
    """One node's agent connection: the token, ``Welcome``, then tasks run inline."""

    def __init__(self, node: int, token: bytes, stats: dict[str, int]) -> None:
        self.node, self.token, self.stats = node, token, stats
        self.frames = FrameBuffer()
        self.authenticated = False
        self.configured: dict[str, Any] | None = None
        self.chan: asyncssh.SSHTCPChannel[bytes] | None = None

    def connection_made(self, chan: Any) -> None:
        self.chan = chan  # an SSH channel, or a TLS transport (the data port)

    def data_received(self, data: bytes, datatype: asyncssh.DataType = None) -> None:
        self.frames.data += data
        try:
            while (length := self._next_length()) is not None:
                self._handle(self.frames.take(length))
        except (protocol.ProtocolError, protocol.ConnectionClosed) as exc:
            print(f"[fleet] node {self.node}: closing a connection: {exc}", file=sys.stderr)
            assert self.chan is not None
            self.chan.close()

    def _next_length(self) -> int | None:
        if not self.authenticated and len(self.frames.data) >= protocol.HEADER.size:
            # As the agent does: a first frame that is not a short RAW one is refused unread.
            size, flags = protocol.HEADER.unpack_from(self.frames.data)
            if flags != protocol.RAW or size > protocol.MAX_TOKEN_FRAME:
                raise protocol.ProtocolError("the first frame must be the raw token")
        return self.frames.whole_frame()

    def _handle(self, frame: Received) -> None:
        if not self.authenticated:
            if not hmac.compare_digest(protocol.read_token(frame), self.token):
                raise protocol.ProtocolError("wrong token")
            self.authenticated = True
            self._send([Welcome(node=self.node, pid=os.getpid(), python=sys.version.split()[0],
                                protocol=protocol.PROTOCOL_VERSION)])
            return
        results = []
        for message in protocol.unbatch(protocol.read_message(frame)):
            if isinstance(message, Task):
                results.append(run_task(message))
            elif isinstance(message, Configure):
                self.configured = message.instance
        self.stats["tasks"] += len(results)
        self.stats["task frames"] += bool(results)
        self._send(results)

    def _send(self, messages: list[Any]) -> None:
        if messages and self.chan is not None:
            self.chan.write(b"".join(bytes(piece) for piece in
                                     protocol.encode(protocol.batched(messages))))


class DataPortAgent(SimulatedAgent, asyncio.Protocol):
    """The same agent reached over the node's data port (TLS, the stack's client certificate
    required: ``node/data_port.server_context``, the real agent's)."""

    def connection_lost(self, exc: BaseException | None) -> None:
        self.chan = None


class NodeServer(asyncssh.SSHServer):
    """One node's SSH server: public-key login, and direct-tcpip to its agent's port only."""

    def __init__(self, node: int, agent: Callable[[], SimulatedAgent]) -> None:
        self.node, self.agent = node, agent

    def begin_auth(self, username: str) -> bool:
        return True  # authentication required: the stack's client key (authorized_client_keys)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str,
                             orig_port: int) -> SimulatedAgent:
        if dest_host not in ("127.0.0.1", "localhost") or dest_port != AGENT_PORT:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, "connection refused")
        return self.agent()


def answer(ports: dict[str, int], process: asyncssh.SSHServerProcess[str]) -> None:
    """The one command a client runs on a node after its start: read the data port the agent
    announced (``cat <workdir>/run/data.port``). Anything else is not simulated: 127."""
    command = process.command or ""
    for workdir, port in ports.items():
        if command.startswith(f"cat {workdir}/run/data.port"):
            process.stdout.write(f"{port}\n")
            process.exit(0)
            return
    process.stderr.write(f"not simulated: {command}\n")
    process.exit(127)


class NodeFiles(asyncssh.SFTPServer):
    """SFTP confined to the fleet's root (where each node's workdir is ``/node-<i>``)."""

    def __init__(self, chan: asyncssh.SSHServerChannel[bytes], root: str) -> None:
        super().__init__(chan, chroot=root.encode())


def tls_context(pki: Any, directory: Path) -> Any:
    """The data ports' TLS: the stack's server pair, its CA required of every client."""
    write_certificates(directory, pki.server)  # as the bootstrap lays them out
    return data_port.server_context(directory)


def raise_descriptor_limit() -> None:
    """Two listening sockets a node and a connection each: more than a default 1,024."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(nodes: int, root: Path, fleet_file: Path, with_data_port: bool = True) -> None:
    """Start ``nodes`` simulated nodes, write ``fleet_file``, serve until stdin closes."""
    raise_descriptor_limit()
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    pki = generate_cluster_certificates("fleet", ["127.0.0.1"])
    (root / "tls").mkdir(parents=True, exist_ok=True)
    context = tls_context(pki, root / "tls") if with_data_port else None
    ports: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    authorized = asyncssh.import_authorized_keys(
        client_key.export_public_key("openssh").decode())
    token = secrets.token_urlsafe(32)
    stats = {"tasks": 0, "task frames": 0}
    described = []
    for index in range(nodes):
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        (root / f"node-{index}").mkdir(parents=True, exist_ok=True)
        agent = functools.partial(SimulatedAgent, index, token.encode(), stats)
        acceptor = await asyncssh.create_server(
            functools.partial(NodeServer, index, agent), "127.0.0.1", 0,
            server_host_keys=[host_key], authorized_client_keys=authorized,
            sftp_factory=functools.partial(NodeFiles, root=str(root)), allow_scp=False,
            process_factory=functools.partial(answer, ports), backlog=128)
        if context is not None:
            listener = await loop.create_server(
                functools.partial(DataPortAgent, index, token.encode(), stats), "127.0.0.1", 0,
                ssl=context, ssl_handshake_timeout=data_port.HANDSHAKE_TIMEOUT, backlog=128)
            ports[f"/node-{index}"] = listener.sockets[0].getsockname()[1]
        described.append({
            "index": index, "port": acceptor.get_port(), "workdir": f"/node-{index}",
            "host_key": host_key.export_public_key("openssh").decode().split("\n")[0],
        })
    fleet = {"nodes": described, "agent_port": AGENT_PORT, "ssh_user": SSH_USER,
             "ssh_private_key": client_key.export_private_key("openssh").decode(),
             "agent_token": token, "pid": os.getpid(),
             "pki": {"ca_pem": pki.ca_pem, "server_cert_pem": pki.server_cert_pem,
                     "server_key_pem": pki.server_key_pem,
                     "client_cert_pem": pki.client_cert_pem,
                     "client_key_pem": pki.client_key_pem} if context is not None else None}
    partial = fleet_file.with_suffix(".tmp")
    partial.write_text(json.dumps(fleet))
    partial.chmod(0o600)
    partial.replace(fleet_file)
    # Serve until whoever started us closes our stdin (or dies).
    await loop.run_in_executor(None, sys.stdin.buffer.read)
    fleet_file.with_suffix(".stats").write_text(json.dumps(stats))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--fleet-file", type=Path, required=True)
    parser.add_argument("--root", type=Path, help="the nodes' SFTP root (default: a temp dir)")
    parser.add_argument("--no-data-port", action="store_true",
                        help="nodes without a data port: the client reaches agents over SSH")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="skyward-fleet-") as scratch:
        asyncio.run(serve(args.nodes, args.root or Path(scratch), args.fleet_file,
                          not args.no_data_port))


if __name__ == "__main__":
    main()
