"""An etcd endpoint on a unix socket, ``unix:/absolute/path``, for pyetcd: a Local head's etcd
serves gRPC, plain, on a socket in its 0700 data dir (node/etcd_server.py ``GRPC_SOCKET``), and
the tasks of a Local pool, all run by the same user, use it instead of TLS over loopback TCP.
No TLS: the directory's mode is the access control, as for any file of the user."""

from __future__ import annotations

import os
from typing import Any

import grpc
import pyetcd

#: An endpoint on a unix socket, ``unix:/absolute/path`` (a Local head's etcd: its plain gRPC
#: socket in the head's 0700 data dir, node/etcd_server.py ``GRPC_SOCKET``): no TLS, the
#: directory's mode is the access control, as for any file of the user.
UNIX_PREFIX = "unix:"
#: The longest path a unix socket's address holds (``sun_path``, less its terminating NUL).
MAX_UNIX_PATH = 107


class UnixEndpoint(pyetcd.Endpoint):  # type: ignore[misc]
    """pyetcd's endpoint on a unix socket: a plain channel to ``unix:/path`` (pyetcd would
    dial ``host:port``).

    A socket's address holds ``MAX_UNIX_PATH`` bytes and a Local head's data dir can be
    deeper, so a longer path is dialled through a descriptor of its nearest existing ancestor
    directory, held while the endpoint lives (``/proc/self/fd/N/rest``, resolved by the kernel
    at each connect: the head may create the rest later, as it bootstraps)."""

    def __init__(self, target: str, *, time_retry: float, opts: list[tuple[str, Any]]) -> None:
        path = target.removeprefix(UNIX_PREFIX)
        if not path.startswith("/"):
            raise ValueError(f"etcd endpoint {target!r}: a unix socket needs an absolute path")
        self._anchor: int | None = None
        self._target = target
        if len(path.encode()) > MAX_UNIX_PATH:
            self._anchor, rest = _anchor(path)
            self._target = f"{UNIX_PREFIX}/proc/self/fd/{self._anchor}/{rest}"
        super().__init__(target, 0, secure=False, time_retry=time_retry, opts=opts)
        self.netloc = target

    def _mkchannel(self, opts: list[tuple[str, Any]]) -> grpc.Channel:
        return grpc.insecure_channel(self._target, options=opts)

    def close(self) -> None:
        super().close()
        if self._anchor is not None:
            os.close(self._anchor)
            self._anchor = None


def _anchor(path: str) -> tuple[int, str]:
    """A descriptor of ``path``'s nearest existing ancestor directory and the rest of
    ``path`` below it; ``ValueError`` when even that is too long for a socket's address."""
    parent, rest = os.path.split(path)
    while True:
        try:
            directory = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            parent, name = os.path.split(parent)
            rest = f"{name}/{rest}"
            continue
        if len(f"/proc/self/fd/{directory}/{rest}".encode()) <= MAX_UNIX_PATH:
            return directory, rest
        os.close(directory)
        raise ValueError(f"etcd's socket {path!r} is too deep to dial: {rest!r} below the "
                         f"nearest existing directory is longer than a socket address holds")
