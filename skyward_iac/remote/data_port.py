"""The client's end of an agent's data port (node/data_port.py): TCP with mutual TLS from the
stack's PKI, the agent's certificate pinned to ``SERVER_NAME`` as etcd's is; of a Local node's
local socket (node/local_socket.py): a Unix socket in its workdir, the agent's uid checked as
it checks ours; and the choice between them and the SSH tunnel.

A node on this machine (Local) is reached over its local socket: no TLS to pay on either side
for a peer on the same host. ``SKYWARD_LOCAL_SOCKET=0`` in the client's environment turns that
off (the TLS figure a cloud node gets, e.g. for ``bench/``). Otherwise the data port is
preferred; a node whose port cannot be reached (a firewall, an agent started without one) is
served through the SSH tunnel as before. ``choose_path`` is that policy, pure, and
``keeps_ssh`` the one that follows from it (whether the node's SSH connection stays open);
``connect`` and ``connect_local`` are the I/O.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fabric

from skyward_iac.api.switches import switched_on
from skyward_iac.collections.pki import SERVER_NAME, IssuedCertificate
from skyward_iac.node import local_socket
from skyward_iac.outputs import ClusterOutputs, NodeAddress
from skyward_iac.remote import ssh
from skyward_iac.remote.bootstrap import DATA_PORT_FILE, LOCAL_SOCKET_FILE, DataPortPlan
from skyward_iac.remote.node_ssh import NodeSsh

log = logging.getLogger("skyward")

#: Seconds to reach a data port (TCP connect and TLS handshake) before falling back.
CONNECT_TIMEOUT = 5.0
LOCAL_SOCKET, DATA_PORT, SSH_TUNNEL = "local socket", "data port", "SSH tunnel"
#: Set to 0 (or false, no, off) in the client's environment: Local nodes are reached over their
#: TLS data port as a cloud node is, not over their local socket.
LOCAL_SOCKET_ENV = "SKYWARD_LOCAL_SOCKET"


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


def connect_local(path: Path, timeout: float = CONNECT_TIMEOUT) -> socket.socket:
    """A connection to a Local node's agent socket at ``path``, whose listener must run as our
    own user (``SO_PEERCRED``, as the agent checks ours); ``OSError`` otherwise."""
    sock = local_socket.connect(path, timeout)
    try:
        _pid, uid, _gid = local_socket.peer_credentials(sock)
        if uid != os.geteuid():
            raise PermissionError(f"the socket {path} is served by uid {uid}, not ours")
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return sock


def local_socket_wanted(environ: Mapping[str, str]) -> bool:
    """Whether a Local node's local socket may be used (``LOCAL_SOCKET_ENV`` not set off)."""
    return switched_on(LOCAL_SOCKET_ENV, environ)


def local_socket_of(workdir: str, plan: DataPortPlan | None) -> Path | None:
    """Where the agent of the node at ``workdir`` listens for same-host clients, when its plan
    gives it a local socket; else None."""
    return Path(workdir) / LOCAL_SOCKET_FILE if plan is not None and plan.local_socket else None


def choose_path(port: int | None, error: BaseException | None, local: Path | None = None,
                local_error: BaseException | None = None,
                local_off: bool = False) -> tuple[str, str]:
    """Which path serves a node, and why: ``(LOCAL_SOCKET | DATA_PORT | SSH_TUNNEL, reason)``
    given its local socket (None: the node has none, not on this machine), the error connecting
    to it (None: none), whether it is turned off (``LOCAL_SOCKET_ENV``; then not tried), the
    data port the node announced (None: none, or not asked: the local socket served) and the
    error connecting to it (None: none)."""
    if local is not None and not local_off and local_error is None:
        return LOCAL_SOCKET, f"same host: Unix socket {local}"
    if local is None:
        note = ""
    elif local_off:
        note = f"; its local socket is off ({LOCAL_SOCKET_ENV}=0)"
    else:
        note = f"; its local socket failed ({local_error})"
    if port is None:
        return SSH_TUNNEL, "the node has no data port" + note
    if error is not None:
        return SSH_TUNNEL, f"its data port {port} is unreachable ({error})" + note
    return DATA_PORT, f"mutual TLS on port {port}" + note


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
                 certificate: IssuedCertificate | None, timeout: float,
                 local: Path | None = None) -> tuple[Any, str]:
    """The stream to a node's agent and its path (``LOCAL_SOCKET``, ``DATA_PORT`` or
    ``SSH_TUNNEL``): the node's ``local`` socket when it has one (on this machine, not turned
    off) and its agent answers there; else its data port when it has one and it answers to the
    stack's ``certificate``; else the SSH tunnel to ``tunnel_port``. One log line says which,
    and why."""
    local_off = not local_socket_wanted(os.environ)
    local_error: BaseException | None = None
    stream: Any = None
    if local is not None and not local_off:
        try:
            stream = connect_local(local, min(timeout, CONNECT_TIMEOUT))
        except (OSError, ValueError) as exc:  # ValueError: a name too long even via its dir
            local_error = exc
    port: int | None = None
    error: BaseException | None = None
    if stream is None and certificate is not None:
        port = announced_port(conn, address.workdir, timeout)
        if port is not None:
            try:
                stream = connect(address.public_address, port, client_context(certificate))
            except OSError as exc:  # ssl.SSLError included
                error = exc
    path, why = choose_path(port, error, local, local_error, local_off)
    log.info("node %d: agent reached over the %s (%s)", address.index, path, why)
    if path != SSH_TUNNEL:
        return stream, path
    held = conn.open() if isinstance(conn, NodeSsh) else conn
    return ssh.open_tunnel(held, tunnel_port, timeout), path
