"""The etcd launcher's health check: etcd's ``/health`` over mutual TLS, in plain HTTP from
the standard library. ``/health`` is a linearizable read through raft, not only a ping; the
gRPC client would cost the launcher ~0.6 CPU-s of imports alone (grpc, pyetcd, protobuf)."""

from __future__ import annotations

import os
import socket
import ssl
from pathlib import Path


def check(endpoint: str, http_socket: Path | None, *, ca: Path, cert: Path, key: Path,
          server_name: str, timeout: float) -> None:
    """GET ``/health`` on ``http_socket`` (etcd 3.6+'s HTTP listener, TLS on a unix socket)
    or else on ``endpoint`` (``host:port``: 3.5 serves HTTP beside gRPC on its client port).
    Raises OSError (ssl.SSLError included) or ValueError unless etcd says it is healthy."""
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(cert, key)
    if http_socket is not None:
        raw = _connect_unix(http_socket, timeout)
    else:
        host, _, port = endpoint.rpartition(":")
        raw = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    with context.wrap_socket(raw, server_hostname=server_name) as tls:
        tls.sendall(f"GET /health HTTP/1.1\r\nHost: {server_name}\r\n"
                    "Connection: close\r\n\r\n".encode())
        reply = b""
        while chunk := tls.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if status.split(" ")[1:2] != ["200"] or b'"health":"true"' not in body:
        raise ValueError(f"etcd is not healthy: {status} {body[:200].decode(errors='replace')}")


def _connect_unix(path: Path, timeout: float) -> socket.socket:
    """A connection to the unix socket ``path``, through a descriptor of its directory: a
    socket's address holds 107 bytes and a data dir can be deeper than that."""
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(f"/proc/self/fd/{directory}/{path.name}")
    except BaseException:
        sock.close()
        raise
    finally:
        os.close(directory)
    return sock
