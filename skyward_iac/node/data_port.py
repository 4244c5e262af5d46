"""The agent's data port: TCP with mutual TLS from the stack's own PKI, beside the loopback port
that the SSH tunnel reaches.

Large arguments over SSH are capped by the SSH channel (paramiko, 424-515 MB/s alone on a quiet
machine, docs/benchmarks.md); TLS over plain TCP runs in C in both processes. The port only
accepts a peer whose certificate the stack's CA signed (``CERT_REQUIRED``, TLS 1.3), and only
then does the connection reach the agent's ordinary handshake: the token first, nothing larger
than ``MAX_TOKEN_FRAME`` read before it matches, checked frame sizes after (``agent.handle``).
The agent's certificate names ``SERVER_NAME`` (the same pinned name as etcd's), so the client
verifies it whatever address it dials.

The TLS material is a directory laid out as etcd's (``etcd_server.write_certificates``):
``ca.crt``, ``server.crt``, ``server.key``.

Where it listens is ``ADDR`` (the kernel picks the port: Local nodes, many on one machine) or
``ADDR:PORT``: a cloud node listens on ``CLOUD_BIND``, a fixed port its stack's firewall opens
to the same source ranges as SSH (infra/programs/common.py ``ingress_rules``), and to nothing
wider.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

#: The files of the TLS directory, named as node/etcd_server.py writes etcd's (not imported
#: from there: it would load the etcd client into every agent).
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "server.crt", "server.key"
#: Seconds a peer has to finish the TLS handshake.
HANDSHAKE_TIMEOUT = 10.0
#: The data port of a cloud node (AWS, GCP): fixed, because the stack's firewall must name it
#: before any agent runs. Unprivileged, below Linux's ephemeral range (32768-60999), so no
#: outgoing connection of the node holds it.
CLOUD_PORT = 7471
#: A cloud node listens on every interface: its public address reaches it through the cloud's
#: 1:1 NAT, and its firewall decides who may (binding the private address recorded at launch
#: would fail outright if the NIC ever carried another).
CLOUD_BIND = f"0.0.0.0:{CLOUD_PORT}"
log = logging.getLogger("skyward.agent")


def endpoint(bind: str) -> tuple[str, int]:
    """``ADDR``, ``ADDR:PORT`` or ``[V6]:PORT`` as ``(address, port)``; port 0 (none given):
    the kernel's choice. A bare IPv6 address has no port. ``ValueError`` for a bad port."""
    if bind.startswith("["):
        host, _, rest = bind[1:].partition("]")
    elif bind.count(":") == 1:
        host, sep, port = bind.partition(":")
        rest = sep + port
    else:  # no port, or a bare IPv6 address
        host, rest = bind, ""
    port = rest.removeprefix(":")
    if not host or (rest and (rest[0] != ":" or not (port.isdigit() and 0 < int(port) < 65536))):
        raise ValueError(f"a data port bind is ADDR, ADDR:PORT or [V6]:PORT with PORT in "
                         f"1-65535, got {bind!r}")
    return host, int(port or 0)


def server_context(tls_dir: Path) -> ssl.SSLContext:
    """TLS 1.3 that demands a client certificate signed by the stack's CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=tls_dir / CA_FILE)
    context.load_cert_chain(tls_dir / CERT_FILE, tls_dir / KEY_FILE)
    return context


def listen(bind: str, context: ssl.SSLContext, serve: Callable[[socket.socket], None],
           refused: Callable[[str], None]) -> socket.socket:
    """Accept connections on ``bind`` (``endpoint``) in a thread of their own; each one that
    completes the mutual TLS handshake is served by ``serve`` (in its own thread), each that
    does not is closed and reported to ``refused`` (with its peer's address). Returns the
    listening socket (the port it announces is its own: see ``bind_server``)."""
    server = bind_server(*endpoint(bind))

    def accept_forever() -> None:
        while True:
            raw, peer = server.accept()
            threading.Thread(target=_serve_one, args=(raw, str(peer[0])), daemon=True).start()

    def _serve_one(raw: socket.socket, peer: str) -> None:
        raw.settimeout(HANDSHAKE_TIMEOUT)
        try:
            tls = context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            log.debug("TLS handshake with %s failed: %s", peer, exc)
            raw.close()
            refused(peer)
            return
        serve(tls)

    threading.Thread(target=accept_forever, daemon=True, name="data-port").start()
    return server


def bind_server(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``. A fixed port already in use (another agent on the
    node) falls back to the kernel's choice, said in the log: the data port only speeds the
    node up, so it never keeps an agent from starting. The client then finds the announced
    port closed by the firewall and keeps the SSH tunnel (remote/data_port.py)."""
    try:
        return socket.create_server((host, port), backlog=64)
    except OSError as exc:
        if port == 0 or exc.errno != errno.EADDRINUSE:
            raise
        log.warning("data port %s:%d is in use; listening on a port of the kernel's choice, "
                    "which the firewall does not open (the client keeps the SSH tunnel)",
                    host, port)
        return socket.create_server((host, 0), backlog=64)
