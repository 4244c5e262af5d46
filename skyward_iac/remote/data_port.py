"""The client's end of an agent's data port (node/data_port.py): TCP with mutual TLS from the
stack's PKI, the agent's certificate pinned to ``SERVER_NAME`` as etcd's is, and the choice
between it and the SSH tunnel.

The data port is preferred; a node whose port cannot be reached (a firewall, an agent started
without one) is served through the SSH tunnel as before. ``choose_path`` is that policy, pure,
and ``keeps_ssh`` the one that follows from it (whether the node's SSH connection stays open);
``connect`` is the I/O.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import ssl
import tempfile
from pathlib import Path
from typing import Any

import fabric

from skyward_iac.collections.pki import SERVER_NAME, IssuedCertificate
from skyward_iac.outputs import ClusterOutputs, NodeAddress
from skyward_iac.remote import ssh
from skyward_iac.remote.bootstrap import DATA_PORT_FILE
from skyward_iac.remote.node_ssh import NodeSsh

log = logging.getLogger("skyward")

#: Seconds to reach a data port (TCP connect and TLS handshake) before falling back.
CONNECT_TIMEOUT = 5.0
DATA_PORT, SSH_TUNNEL = "data port", "SSH tunnel"


def client_context(certificate: IssuedCertificate) -> ssl.SSLContext:
    """TLS 1.3, the server verified against the stack's CA under ``SERVER_NAME``, and our
    client certificate presented."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, host names checked
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_verify_locations(cadata=certificate.ca_pem)
    # ``load_cert_chain`` reads files only: a private directory, gone once loaded.
    with tempfile.TemporaryDirectory(prefix="skyward-tls-") as directory:
        cert, key = Path(directory) / "client.crt", Path(directory) / "client.key"
        for path, text in ((cert, certificate.cert_pem), (key, certificate.key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(text)
        context.load_cert_chain(cert, key)
    return context


def connect(address: str, port: int, context: ssl.SSLContext,
            timeout: float = CONNECT_TIMEOUT) -> ssl.SSLSocket:
    """A mutually authenticated connection to an agent's data port; ``OSError`` (including
    ``ssl.SSLError``) when it cannot be had within ``timeout``."""
    raw = socket.create_connection((address, port), timeout=timeout)
    try:
        tls = context.wrap_socket(raw, server_hostname=SERVER_NAME)
    except BaseException:
        raw.close()
        raise
    tls.settimeout(None)
    tls.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return tls


def choose_path(port: int | None, error: BaseException | None) -> tuple[str, str]:
    """Which path serves a node, and why: ``(DATA_PORT | SSH_TUNNEL, reason)`` given the
    data port the node announced (None: none) and the error connecting to it (None: none)."""
    if port is None:
        return SSH_TUNNEL, "the node has no data port"
    if error is not None:
        return SSH_TUNNEL, f"its data port {port} is unreachable ({error})"
    return DATA_PORT, f"mutual TLS on port {port}"


def keeps_ssh(path: str, carries_collections: bool) -> bool:
    """Whether a node's SSH connection stays open once its agent is reached over ``path``:
    the tunnel runs through it, and the head's carries the client's collections tunnel to
    etcd (``carries_collections``); any other node reached over its data port needs SSH only
    now and then (a fence, an unmount, a forwarded port), opened again when asked."""
    return path == SSH_TUNNEL or carries_collections


def certificate_of(outputs: ClusterOutputs) -> IssuedCertificate | None:
    """The stack's client certificate, or None when the stack has no PKI (an older stack)."""
    pki = outputs.certificates
    if pki is None:
        return None
    return IssuedCertificate(pki.ca_pem, pki.client_cert_pem, pki.client_key_pem)


def announced_port(conn: fabric.Connection | NodeSsh, workdir: str,
                   timeout: float) -> int | None:
    """The data port the node's agent wrote at start, or None (none, or an older agent)."""
    result = conn.run(f"cat {shlex.quote(workdir)}/{DATA_PORT_FILE} 2>/dev/null", hide=True,
                      warn=True, in_stream=False, timeout=timeout)
    text = result.stdout.strip()
    return int(text) if result.exited == 0 and text.isdigit() else None


def agent_stream(conn: fabric.Connection | NodeSsh, address: NodeAddress, tunnel_port: int,
                 certificate: IssuedCertificate | None, timeout: float) -> tuple[Any, str]:
    """The stream to a node's agent and its path (``DATA_PORT`` or ``SSH_TUNNEL``): its data
    port when it has one and it answers to the stack's ``certificate``, else the SSH tunnel to
    ``tunnel_port``. One log line says which, and why."""
    port = announced_port(conn, address.workdir, timeout) if certificate else None
    error: BaseException | None = None
    if port is not None and certificate is not None:
        try:
            stream: Any = connect(address.public_address, port, client_context(certificate))
        except OSError as exc:  # ssl.SSLError included
            error = exc
    path, why = choose_path(port, error)
    log.info("node %d: agent reached over the %s (%s)", address.index, path, why)
    if path == DATA_PORT:
        return stream, path
    held = conn.open() if isinstance(conn, NodeSsh) else conn
    return ssh.open_tunnel(held, tunnel_port, timeout), path
