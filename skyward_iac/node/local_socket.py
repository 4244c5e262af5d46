"""The agent's same-host listener: a Unix stream socket in the node's private workdir.

A Local node runs on the client's machine as the client's user, so mutual TLS over loopback TCP
(node/data_port.py) buys it nothing that a Unix socket does not give for less: the socket file
is created mode 0600 in the node's workdir (a 0700 directory of the user), and every accepted
connection is checked with ``SO_PEERCRED``: a peer whose uid is not the agent's own is closed
and reported before a byte is read, whatever the file's modes allow. The rest reach the
agent's ordinary handshake (the token first, checked frame sizes after: ``agent.handle``).
Clouds keep the TLS data port: their client is on another machine.

A socket's address is at most 107 bytes (``sun_path``) and a Local workdir can be longer, so a
long path is bound and connected through a descriptor of its directory
(``/proc/self/fd/N/NAME``), which the kernel resolves like any path: no ``chdir`` (process-wide,
unsafe with threads) and no abstract name (which any local user could reach).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

#: The longest ``sun_path`` Linux takes (108 bytes with the terminating NUL).
MAX_ADDRESS = 107
log = logging.getLogger("skyward.agent")


@contextlib.contextmanager
def address_of(path: Path) -> Iterator[str]:
    """An address naming ``path`` that fits ``sun_path``: the path itself when short enough,
    else one through a descriptor of its directory, held open while the caller uses it."""
    if len(os.fsencode(path)) <= MAX_ADDRESS:
        yield str(path)
        return
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        address = f"/proc/self/fd/{directory}/{path.name}"
        if len(os.fsencode(address)) > MAX_ADDRESS:
            raise ValueError(f"the socket's name is too long: {path.name!r}")
        yield address
    finally:
        os.close(directory)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket, as the kernel
    recorded them when it connected."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def bind(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0600. A stale socket there (an agent gone) is
    unlinked first; anything else there is left alone and refused (``FileExistsError``)."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise FileExistsError(f"{path} exists and is not a socket")
        path.unlink()
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with address_of(path) as address:
            server.bind(address)
            # Before listen: nobody can connect while the mode is still the umask's. The
            # directory is private anyway, and the uid check is what refuses.
            os.chmod(address, 0o600)
        server.listen(64)
    except BaseException:
        server.close()
        raise
    return server


def connect(path: Path, timeout: float) -> socket.socket:
    """A connection to the Unix socket at ``path`` (``OSError`` when there is none)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        with address_of(path) as address:
            sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def listen(path: Path, serve: Callable[[socket.socket], None],
           refused: Callable[[str], None]) -> socket.socket:
    """Accept connections at ``path`` (``bind``) in a thread of their own; each from a process
    of the agent's own uid is served by ``serve`` (in its own thread), each other one closed at
    once and reported to ``refused`` (with its uid). Returns the listening socket."""
    server = bind(path)
    own = os.geteuid()

    def accept_forever() -> None:
        while True:
            sock, _ = server.accept()
            _pid, uid, _gid = peer_credentials(sock)
            if uid != own:
                sock.close()
                refused(f"uid {uid} on the local socket (not the agent's user)")
                continue
            threading.Thread(target=serve, args=(sock,), daemon=True).start()

    threading.Thread(target=accept_forever, daemon=True, name="local-socket").start()
    return server
