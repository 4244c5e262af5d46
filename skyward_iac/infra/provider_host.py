"""Runs Pulumi's Python dynamic provider for our stacks, guarded.

The SDK's provider (``python -m pulumi.dynamic``) serves gRPC without authentication on
127.0.0.1 and unpickles the ``__provider`` field of what it is sent: while one runs, any local
user could make it run code as the pool's owner, and a provider orphaned by an interrupted
engine would stay open to that forever. The engine starts this module instead (through the
``pulumi-resource-pulumi-python`` launcher that ``tools/pulumi/build.sh`` installs), which
runs the SDK's provider with two guards:

* every call's peer must be a process of this user: the peer's loopback port is looked up in
  ``/proc/net/tcp`` to find the uid that owns its socket; anyone else gets PERMISSION_DENIED
  before anything of the request is unpickled;
* the provider exits as soon as its engine (the parent process) is gone.

``reap_orphans()`` stops provider processes of this user that outlived their engine (from
before these guards, or after a crash); ``skyward-iac gc`` and every new pool call it.
Run as ``python -u -m skyward_iac.infra.provider_host`` (what the launcher execs).
"""

from __future__ import annotations

import os
import runpy
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

#: How often the provider checks that its engine still runs.
PARENT_CHECK = 0.5
#: Command-line markers of a dynamic-provider process (ours, and the SDK's own).
PROVIDER_MARKERS = (b"skyward_iac.infra.provider_host", b"pulumi.dynamic")


#: 127.0.0.1 as /proc/net/tcp writes it, and as /proc/net/tcp6 writes it IPv4-mapped.
_LOOPBACK = ("0100007F", "0000000000000000FFFF00000100007F")


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
    """Refuses every call whose peer socket is not owned by this process's user."""

    def __init__(self, owner: Callable[[str, int], int | None] = socket_owner) -> None:
        self.uid = os.getuid()
        self.owner = owner
        #: The port the provider listens on (known once the server binds it).
        self.port = 0

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler  # the provider's calls are all unary
        inner = handler.unary_unary

        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            if self.owner(context.peer(), self.port) != self.uid:
                context.abort(grpc.StatusCode.PERMISSION_DENIED,
                              f"this provider serves uid {self.uid} only")
            return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            guarded, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


def exit_with_parent(interval: float = PARENT_CHECK) -> None:
    """End this process when its parent (the engine) is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(0)

    threading.Thread(target=watch, name="skyward-provider-parent", daemon=True).start()


def reap_orphans() -> list[int]:
    """Stop this user's provider processes whose engine is gone (parented to init or a
    subreaper that is not a Pulumi engine); returns their pids."""
    reaped = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != os.getuid():
                continue
            cmdline = (proc / "cmdline").read_bytes()
            if not any(marker in cmdline for marker in PROVIDER_MARKERS):
                continue
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent != 1 and b"pulumi" in Path(f"/proc/{parent}/cmdline").read_bytes():
                continue  # its engine still runs it
            os.kill(int(proc.name), signal.SIGKILL)
            reaped.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return reaped


def main() -> None:
    exit_with_parent()
    plain_server = grpc.server

    def guarded_server(*args: Any, **kwargs: Any) -> Any:
        guard = SameUserOnly()
        kwargs["interceptors"] = (*(kwargs.get("interceptors") or ()), guard)
        server = plain_server(*args, **kwargs)
        bind = server.add_insecure_port

        def add_insecure_port(address: str) -> int:
            guard.port = bind(address)
            return guard.port

        server.add_insecure_port = add_insecure_port
        return server

    # The SDK's provider builds its server with grpc.server; this process exists to run it,
    # so its server is built with the guard.
    grpc.server = guarded_server
    runpy.run_module("pulumi.dynamic", run_name="__main__")


if __name__ == "__main__":
    main()
