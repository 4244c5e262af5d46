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
"""

from __future__ import annotations

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
log = logging.getLogger("skyward.agent")


def server_context(tls_dir: Path) -> ssl.SSLContext:
    """TLS 1.3 that demands a client certificate signed by the stack's CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=tls_dir / CA_FILE)
    context.load_cert_chain(tls_dir / CERT_FILE, tls_dir / KEY_FILE)
    return context


def listen(bind: str, context: ssl.SSLContext, serve: Callable[[socket.socket], None],
           refused: Callable[[str], None], port: int = 0) -> socket.socket:
    """Accept connections on ``bind:port`` in a thread of their own; each one that completes
    the mutual TLS handshake is served by ``serve`` (in its own thread), each that does not
    is closed and reported to ``refused`` (with its peer's address). Returns the listening
    socket (its port, when ``port`` is 0, is the kernel's choice)."""
    server = socket.create_server((bind, port), backlog=64)

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
