"""The worker agent: one persistent process per node that accepts the client's tasks.

It listens on the node's loopback (the client reaches it through an SSH direct-tcpip
channel) and, with ``--data-bind``, on a data port with mutual TLS (node/data_port.py), where
only the stack's certificate holders get as far as the token; with ``--local-socket`` (Local
nodes: the client is on this machine) also on a Unix socket in the workdir, where only the
agent's own user does (node/local_socket.py). On every one it demands the per-stack
token as the first frame, before it unpickles anything. The client's heartbeat reaches the node
through it once the node is attached (``Beat``, written to ``--heartbeat`` for the watchdog).
Tasks run in worker subprocesses (``node/worker.py``) admitted by ``node/slots.py``, so a
task that kills its process never takes the agent down.

The agent leads its own process group, which its workers (and the processes their tasks start)
join, so one ``kill`` of the group fences the node (``remote/fence.py``); and its workers die
with it, however it dies (see ``Slots``).
Run as ``python -m skyward_iac.node agent --token-file F --port-file F [--concurrency N]
[--data-bind ADDR --data-port-file F --tls-dir D] [--local-socket PATH]
[--executor thread|process] [--fresh-processes] [--heartbeat F] [--metrics JSON] [--preemption aws|gcp
[--metadata-url URL]] [--refusals-every SECONDS]``.

Connections refused for want of the token are logged as ``node/refusals.py`` decides: the
first at once, then one summary line per ``--refusals-every`` seconds (60 by default) however
many a flood brings.

``--metrics`` (``observability.metrics.to_json``) starts a ``MetricsSampler`` whose readings go
to every connected client as ``MetricSamples`` messages.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from skyward_iac.api import metrics
from skyward_iac.api.deadlines import BUDGET_FILE
from skyward_iac.node import data_port, fd_buffers, local_socket, protocol, relay
from skyward_iac.node.buffer_cache import BufferCache, SharedArgumentError, agent_cap
from skyward_iac.node.messages import (
    Beat,
    Cancel,
    Configure,
    MetricSamples,
    PreemptionNotice,
    Result,
    Task,
    Welcome,
)
from skyward_iac.node.preemption import PreemptionWatcher
from skyward_iac.node.read_ahead import ReadAhead
from skyward_iac.node.refusals import SUMMARY_EVERY, RefusalLog
from skyward_iac.node.sampler import MetricSample, MetricsSampler
from skyward_iac.node.slots import Slots
from skyward_iac.node.worker import describe_failure

HANDSHAKE_TIMEOUT = 10.0
log = logging.getLogger("skyward.agent")


class Connection:
    """One authenticated client connection: hands tasks to the slots; its ``channel`` is where
    their messages go back."""

    def __init__(self, channel: protocol.Channel, slots: Slots,
                 heartbeat: Path | None = None) -> None:
        self.channel = channel
        self.slots = slots
        #: The large arguments its client asked to keep (node/buffer_cache.py).
        self.kept = BufferCache(agent_cap())
        #: Where the client's ``Beat``s are written (None: the agent was started without
        #: ``--heartbeat``, and beats are ignored).
        self.heartbeat = heartbeat

    def send(self, message: object) -> None:
        self.channel.send(message)

    def serve(self) -> None:
        """Handle the client's frames until it disconnects; a large argument's buffers are
        forwarded to its worker as they arrive (node/relay.py)."""
        relay.serve(self.channel, self.dispatch)

    def dispatch(self, messages: Sequence[object]) -> None:
        """One frame's messages, in the client's order."""
        tasks: list[Task] = []
        for message in messages:
            if isinstance(message, Task):
                try:
                    tasks.append(self.kept.resolve(message))
                except SharedArgumentError as exc:  # this task alone fails
                    self.send(Result(message.task_id, failure=describe_failure(exc)))
                continue
            if tasks:  # keep the client's order: tasks before a later cancel or configure
                self.slots.submit_many(tasks, self.channel)
                tasks = []
            if isinstance(message, Cancel):
                self.slots.cancel(message.task_id)
            elif isinstance(message, Configure):
                self.slots.configure(message)
            elif isinstance(message, Beat) and self.heartbeat is not None:
                write_beat(self.heartbeat, message)
        if tasks:
            self.slots.submit_many(tasks, self.channel)


class Listeners:
    """The authenticated connections that want the node's metric samples and notices.

    A *retained* message (a preemption notice) is also kept and sent to every connection that
    arrives later, so a client that connects (or reconnects) after the notice still hears it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: set[Connection] = set()
        self._retained: list[object] = []

    def add(self, connection: Connection) -> None:
        with self._lock:
            self._connections.add(connection)
            retained = list(self._retained)
        for message in retained:
            self._send(connection, message)

    def discard(self, connection: Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    def broadcast(self, samples: list[MetricSample]) -> None:
        """Send ``samples`` to every connection."""
        self.notify(MetricSamples(tuple(samples)))

    def notify(self, message: object, retain: bool = False) -> None:
        """Send ``message`` to every connection (and, ``retain``, to every later one)."""
        with self._lock:
            connections = list(self._connections)
            if retain:
                self._retained.append(message)
        for connection in connections:
            self._send(connection, message)

    def _send(self, connection: Connection, message: object) -> None:
        try:
            connection.send(message)
        except OSError:
            self.discard(connection)  # a broken one is dropped; its reader ends it


def write_beat(heartbeat: Path, beat: Beat) -> None:
    """Write the client's ``beat`` as its SFTP beats do: the budget's note first (when it
    changed), then ``beat COUNT`` to the heartbeat file; each file replaced whole, so the
    watchdog never reads half of one."""
    if beat.budget is not None:
        write_atomically(heartbeat.with_name(BUDGET_FILE), beat.budget)
    write_atomically(heartbeat, f"beat {beat.count}\n")


def authenticate(channel: protocol.Channel, token: bytes) -> bool:
    """True when the first frame is exactly the token. Nothing is unpickled, decompressed or
    read beyond ``MAX_TOKEN_FRAME`` bytes before this: a first frame that is not RAW or is
    longer is refused as soon as its header is read."""
    try:
        payload = channel.receive_raw(protocol.MAX_TOKEN_FRAME)
    except (OSError, protocol.ConnectionClosed, protocol.ProtocolError):
        return False
    return hmac.compare_digest(payload, token)


def handle(sock: socket.socket, token: bytes, slots: Slots, refusals: RefusalLog,
           listeners: Listeners | None = None, heartbeat: Path | None = None) -> None:
    """Serve one connection (TCP, TLS or a Unix socket): the token first, then the client's
    tasks."""
    if sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = fd_buffers.reader_for(sock)  # on a Unix socket, descriptors are never dropped
    with sock:
        channel = protocol.Channel(reader, sock)
        sock.settimeout(HANDSHAKE_TIMEOUT)
        if not authenticate(channel, token) or fd_buffers.holds(reader):
            fd_buffers.discard(reader)  # none may come before the token
            refusals.refused(peer_host(sock))
            return
        sock.settimeout(None)
        # Large buffers, only for a peer that proved it holds the token: a 100 MB argument
        # arrives in fewer, larger reads.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        # Read ahead only now (a small frame in one read): nothing beyond the token before.
        channel = protocol.Channel(ReadAhead(reader), sock)
        connection = Connection(channel, slots, heartbeat)
        connection.send(Welcome(node=slots.node, pid=os.getpid(), python=sys.version.split()[0],
                                protocol=protocol.PROTOCOL_VERSION,
                                shared_cap=connection.kept.cap, descriptors=reader is not sock))
        if listeners is not None:
            listeners.add(connection)
        try:
            connection.serve()
        except (protocol.ConnectionClosed, OSError):
            log.info("client disconnected")
        except protocol.ProtocolError as exc:
            log.warning("closed a client connection that broke the protocol: %s", exc)
        finally:
            fd_buffers.discard(reader)
            connection.kept.clear()
            if listeners is not None:
                listeners.discard(connection)


def peer_host(sock: socket.socket) -> str:
    """The address a connection came from (its port changes with every connection)."""
    if sock.family == socket.AF_UNIX:
        return "the local socket"
    try:
        return str(sock.getpeername()[0])
    except OSError:
        return "a peer already gone"


def lead_process_group() -> int:
    """Make the agent the leader of a process group (bootstrap's ``setsid`` already did, a
    test's ``Popen`` did not) and return its id, which is the agent's pid."""
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)
    return os.getpid()


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m skyward_iac.node agent", description=__doc__)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--executor", choices=("thread", "process"), default="thread")
    parser.add_argument("--fresh-processes", action="store_true",
                        help="process executor: a new process for every task")
    parser.add_argument("--node", type=int, default=0)
    parser.add_argument("--preemption", choices=("aws", "gcp"),
                        default=os.environ.get("SKYWARD_PREEMPTION") or None,
                        help="watch this cloud's metadata server for an interruption notice")
    parser.add_argument("--metadata-url", default=os.environ.get("SKYWARD_METADATA_URL") or None,
                        help="the metadata server's base URL (default: the cloud's own)")
    parser.add_argument("--metrics", type=metrics.from_json, default=(),
                        help="metrics to sample and stream, as observability.metrics.to_json")
    parser.add_argument("--data-bind", default=None,
                        help="also listen with mutual TLS on ADDR or ADDR:PORT (no port: the "
                             "kernel's choice; needs --tls-dir, --data-port-file)")
    parser.add_argument("--data-port-file", type=Path, default=None)
    parser.add_argument("--tls-dir", type=Path, default=None,
                        help="ca.crt, server.crt, server.key of the stack's PKI")
    parser.add_argument("--local-socket", type=Path, default=None,
                        help="also listen on a Unix socket at PATH (mode 0600) for processes "
                             "of the agent's own user (a Local node's client)")
    parser.add_argument("--heartbeat", type=Path, default=None,
                        help="the heartbeat file the client's Beat messages are written to "
                             "(the watchdog's; the budget file beside it)")
    parser.add_argument("--refusals-every", type=float, default=SUMMARY_EVERY,
                        help="seconds between two log lines summing up refused connections")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    token = args.token_file.read_bytes().strip()
    server = socket.create_server((args.bind, 0), backlog=64)
    group = lead_process_group()
    if args.executor == "process":
        slots = Slots(args.concurrency, 1, once=args.fresh_processes, node=args.node, group=group)
    else:
        slots = Slots(1, args.concurrency, once=False, node=args.node, group=group)
    listeners = Listeners()
    MetricsSampler(args.metrics, listeners.broadcast).start()
    if args.preemption:
        node = args.node
        PreemptionWatcher(args.preemption, lambda deadline, reason: listeners.notify(
            PreemptionNotice(node, deadline, reason), retain=True), args.metadata_url).start()
    refusals = RefusalLog(log, args.refusals_every)
    signal.signal(signal.SIGTERM, lambda *_: (refusals.flush(), slots.close_plugins(),
                                              os._exit(0)))
    if args.data_bind:
        if args.tls_dir is None or args.data_port_file is None:
            parser.error("--data-bind needs --tls-dir and --data-port-file")
        data = data_port.listen(
            args.data_bind, data_port.server_context(args.tls_dir),
            lambda sock: handle(sock, token, slots, refusals, listeners, args.heartbeat),
            lambda peer: refusals.refused(f"{peer} (no valid client certificate)"))
        write_atomically(args.data_port_file, str(data.getsockname()[1]))
        log.info("data port (mutual TLS) on %s", data.getsockname())
    if args.local_socket is not None:
        local_socket.listen(
            args.local_socket,
            lambda sock: handle(sock, token, slots, refusals, listeners, args.heartbeat),
            refusals.refused)
        log.info("local socket (the agent's user only) at %s", args.local_socket)
    write_atomically(args.port_file, str(server.getsockname()[1]))
    log.info("agent of node %s listening on %s", args.node, server.getsockname())
    while True:
        sock, _ = server.accept()
        threading.Thread(target=handle,
                         args=(sock, token, slots, refusals, listeners, args.heartbeat),
                         daemon=True).start()

