"""gRPC servers on loopback that serve the user who started them, and nobody else.

Pulumi's plugins and the Automation API talk gRPC over 127.0.0.1 with no authentication, and
any local user can connect to 127.0.0.1. Each of these servers, run by us, is built here:

* the dynamic provider (``infra/engine/provider_host.py``), which unpickles what it is sent;
* the language host (``infra/engine/language_host.py``), whose ``Run`` executes the program that the
  request names;
* the Automation API's own servers in the client process: the inline program's
  ``LanguageRuntime`` (``Run`` executes the pool's program against the monitor the request
  names) and the engine-events stream (``guard_automation_servers``).

The rule is the same for all: the peer's loopback socket is looked up in ``/proc/net/tcp``
(and ``tcp6``) to find the uid that owns it; a call from any other uid, or from a socket that
cannot be found, gets ``PERMISSION_DENIED`` before its request is read by the servicer.

Plain TCP servers (the port forwards of ``pool.forward`` and ``skyward-iac forward``) apply the
same rule to each accepted socket with ``accepted_socket_owner``, and close the others.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

#: 127.0.0.1 as /proc/net/tcp writes it, and as /proc/net/tcp6 writes it IPv4-mapped.
_LOOPBACK = ("0100007F", "0000000000000000FFFF00000100007F")

#: The real ``grpc.server``, captured before anyone points ``grpc.server`` at ``guarded_server``.
_plain_server = grpc.server

#: Which uid owns the socket connecting a gRPC peer to one of our ports (None: not found).
SocketOwner = Callable[[str, int], "int | None"]


def socket_owner(peer: str, server_port: int,
                 tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")) -> int | None:
    """The uid owning the TCP socket that connects ``peer`` (gRPC's ``ipv4:127.0.0.1:PORT``,
    or its IPv4-mapped IPv6 form) to our ``server_port`` on 127.0.0.1, or None when no such
    socket is found (the call is then refused). Both ends are matched, so no other socket of
    the machine can stand in for it."""
    kind, _, rest = peer.partition(":")
    host, _, port_text = rest.rpartition(":")
    if (kind, host.strip("[]")) not in (("ipv4", "127.0.0.1"), ("ipv6", "::ffff:127.0.0.1")) \
            or not port_text.isdigit():
        return None
    ends = {(f"{loopback}:{int(port_text):04X}", f"{loopback}:{server_port:04X}")
            for loopback in _LOOPBACK}
    return _owner_in_tables(ends, tables)


def accepted_socket_owner(conn: socket.socket,
                          tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6"),
                          ) -> int | None:
    """The uid owning the client end of ``conn``, a TCP socket our server accepted on an IPv4
    address, or None when it is not found (the connection is then refused). Both ends are
    matched, as in ``socket_owner``."""
    try:
        (peer_host, peer_port), (our_host, our_port) = conn.getpeername(), conn.getsockname()
        peer, ours = _proc_address(peer_host), _proc_address(our_host)
    except (OSError, ValueError):  # closed meanwhile, or not an IPv4 socket
        return None
    # The client's socket lists the client as its local end; an IPv4 client of a dual-stack
    # server shows in tcp6 with IPv4-mapped addresses.
    ends = {(f"{peer}:{peer_port:04X}", f"{ours}:{our_port:04X}"),
            (f"{_MAPPED}{peer}:{peer_port:04X}", f"{_MAPPED}{ours}:{our_port:04X}")}
    return _owner_in_tables(ends, tables)


def from_this_user(conn: socket.socket) -> bool:
    """Whether ``conn``'s client is a socket of this process's user (``accepted_socket_owner``);
    the check a plain server on loopback makes before it serves a connection."""
    return accepted_socket_owner(conn) == os.getuid()


def _proc_address(host: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it: its 32 bits in host byte order, in hex."""
    return f"{struct.unpack('=I', socket.inet_aton(host))[0]:08X}"


#: The first 96 bits of an IPv4-mapped IPv6 address as /proc/net/tcp6 writes them.
_MAPPED = "0000000000000000" + f"{struct.unpack('=I', bytes((0, 0, 255, 255)))[0]:08X}"


def _owner_in_tables(ends: set[tuple[str, str]], tables: tuple[str, ...]) -> int | None:
    """The uid of the first socket in ``tables`` whose (local, remote) addresses are among
    ``ends``."""
    for table in tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            # sl local_address rem_address st ... uid: the client's end of our connection.
            fields = line.split()
            if len(fields) > 7 and (fields[1], fields[2]) in ends:
                return int(fields[7])
    return None


class SameUserOnly(grpc.ServerInterceptor):
    """Refuses every call whose peer socket is not owned by this process's user: unary and
    streaming calls alike, before the servicer sees the request."""

    def __init__(self, owner: SocketOwner = socket_owner) -> None:
        self.uid = os.getuid()
        self.owner = owner
        #: The ports the server listens on (known once it binds them).
        self.ports: set[int] = set()

    def allows(self, peer: str) -> bool:
        """Whether ``peer`` is a socket of this user connected to one of our ports."""
        return any(self.owner(peer, port) == self.uid for port in self.ports)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        for kind, factory in _HANDLER_FACTORIES.items():
            inner = getattr(handler, kind)
            if inner is not None:
                return factory(self._guarded(inner),
                               request_deserializer=handler.request_deserializer,
                               response_serializer=handler.response_serializer)
        return handler

    def _guarded(self, inner: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[..., Any]:
        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            if not self.allows(context.peer()):
                context.abort(grpc.StatusCode.PERMISSION_DENIED,
                              f"this server serves uid {self.uid} only")
            return inner(request, context)
        return guarded


#: A handler's attribute for each kind of RPC, and how a handler of that kind is built.
_HANDLER_FACTORIES: dict[str, Callable[..., Any]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def guarded_server(*args: Any, **kwargs: Any) -> grpc.Server:
    """``grpc.server(*args, **kwargs)`` with ``SameUserOnly`` in front of every call; the ports
    it binds with ``add_insecure_port`` are the ones the guard matches peers against."""
    guard = SameUserOnly()
    kwargs["interceptors"] = (*(kwargs.get("interceptors") or ()), guard)
    server = _plain_server(*args, **kwargs)
    bind = server.add_insecure_port

    def add_insecure_port(address: str) -> int:
        port = bind(address)
        guard.ports.add(port)
        return port

    server.add_insecure_port = add_insecure_port  # type: ignore[method-assign]
    return server


class _GrpcWithGuardedServers:
    """The ``grpc`` module as the Automation API's stack module sees it: the same, except that
    ``server`` builds guarded servers."""

    server = staticmethod(guarded_server)

    def __getattr__(self, name: str) -> Any:
        return getattr(grpc, name)


def guard_automation_servers() -> None:
    """Make the Automation API build its inline-program and engine-events servers guarded.

    ``pulumi.automation._stack`` starts both with ``grpc.server`` and offers no hook for an
    interceptor, so its module-level ``grpc`` name is pointed at a view of ``grpc`` whose
    ``server`` is ``guarded_server``. Only that module is affected (user code keeps the real
    ``grpc.server``); tests/chaos/test_local_servers.py fails if an SDK upgrade moves the
    servers elsewhere."""
    from pulumi.automation import _stack

    if not isinstance(_stack.grpc, _GrpcWithGuardedServers):
        _stack.grpc = _GrpcWithGuardedServers()  # type: ignore[assignment]
