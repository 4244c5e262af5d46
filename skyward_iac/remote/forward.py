"""A local port forwarded over a node's SSH connection (``ssh -L``), that fails one connection
at a time and never raises into its owner.

Fabric's ``Connection.forward_local`` does the same with one accept thread; but the first
channel the server refuses (the far end is not listening) kills that thread, later connections
wait unanswered in the listen backlog (a client times out instead of failing), and the error is
raised when the forward is closed, from whatever ``with`` block closes it. Here a connection
whose channel cannot open is closed at once, so a client fails fast, and the owner is told why
(``on_trouble``); ``close`` never raises. Each connection is pumped by two blocking threads, one
per direction, in 64 KiB chunks.

127.0.0.1 is open to every local user: a forward accepts only this user's connections
(``same_user.from_this_user``, every forward: ``pool.forward``, ``skyward-iac forward`` and the
collections' tunnel to etcd) and closes the others before a channel is opened for them.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from enum import Enum

import paramiko

from skyward_iac.remote.ssh import TUNNEL_MAX_PACKET, TUNNEL_WINDOW
from skyward_iac.same_user import from_this_user

log = logging.getLogger("skyward")
_CHUNK = 64 << 10


class Trouble(Enum):
    """What a forward saw go wrong, for its owner to judge."""

    #: The node's sshd could not connect to the target: nothing listens there.
    REFUSED = "refused"
    #: The SSH connection itself is gone (or failed to open a channel).
    SSH_LOST = "ssh lost"
    #: The far end closed a live connection (the target process may have died).
    CLOSED_BY_TARGET = "closed by target"


#: The node's current SSH transport (None when it has none), asked anew for every connection.
TransportSource = Callable[[], "paramiko.Transport | None"]
#: Told of every trouble, with the exception or reason; called from a forward's own threads.
TroubleHandler = Callable[[Trouble, str], None]
#: Whether an accepted client socket may use the forward (False: it is closed at once).
AcceptCheck = Callable[[socket.socket], bool]


def open_channel(transport: paramiko.Transport | None, target: tuple[str, int],
                 timeout: float) -> paramiko.Channel:
    """A direct-tcpip channel to ``target`` as seen from the node; ``ChannelException`` when
    nothing listens there, ``SSHException`` when the connection is gone."""
    if transport is None or not transport.is_active():
        raise paramiko.SSHException("the SSH connection is closed")
    return transport.open_channel("direct-tcpip", target, ("127.0.0.1", 0), timeout=timeout,
                                  window_size=TUNNEL_WINDOW, max_packet_size=TUNNEL_MAX_PACKET)


def check(transport: paramiko.Transport | None, target: tuple[str, int], timeout: float,
          settle: float = 0.5) -> tuple[Trouble, str] | None:
    """None when something still listens at ``target``, else the trouble and why.

    A fresh channel must open and then stay open for ``settle`` seconds: a process that is
    dying may still accept a connection for a moment (its listening socket is closed last),
    and then resets it. A server waiting for us to speak first (TLS) sends nothing."""
    try:
        channel = open_channel(transport, target, timeout)
    except Exception as exc:  # noqa: BLE001 - paramiko raises several kinds
        return classify(exc), str(exc) or type(exc).__name__
    try:
        channel.settimeout(settle)
        if channel.recv(1) == b"":
            return Trouble.REFUSED, "it closed a new connection at once"
        return None  # it spoke first: alive, whatever it is
    except TimeoutError:
        return None
    except (OSError, EOFError, paramiko.SSHException) as exc:
        return Trouble.SSH_LOST, str(exc) or type(exc).__name__
    finally:
        channel.close()


def classify(exc: BaseException) -> Trouble:
    """Which trouble an exception from ``open_channel`` means."""
    return Trouble.REFUSED if isinstance(exc, paramiko.ChannelException) else Trouble.SSH_LOST


class LocalForward:
    """``127.0.0.1:port`` forwarded to ``target`` through the node: ``local_port``, or a free
    port when 0 (``OSError`` when it cannot be bound).

    ``refuse()`` makes it close every new connection at once (the target is known gone: a
    client fails fast instead of timing out). ``accept``: which clients may connect (by
    default this user's processes only: 127.0.0.1 is open to every local user); a rejected
    client is closed before anything reaches the node.
    """

    def __init__(self, transport: TransportSource, target: tuple[str, int],
                 on_trouble: TroubleHandler, timeout: float = 10.0, local_port: int = 0,
                 accept: AcceptCheck = from_this_user) -> None:
        self._transport, self.target, self._on_trouble = transport, target, on_trouble
        self._timeout = timeout
        self._check = accept
        #: Connections ``accept`` rejected so far.
        self.rejected = 0
        self._closed = threading.Event()
        self._refusing = False
        self._lock = threading.Lock()
        self._open: set[_Connection] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # A fixed port is free again at once after an earlier forward on it (TIME_WAIT).
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:  # bound and listening before anyone is told
            self._listener.bind(("127.0.0.1", local_port))
            self._listener.listen(16)
        except OSError:
            self._listener.close()
            raise
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name=f"skyward-forward-{self.port}",
                         daemon=True).start()

    def refuse(self) -> None:
        """Close every connection from now on, and those open now."""
        self._refusing = True
        self._close_connections()

    def close(self) -> None:
        """Stop listening and close every connection (idempotent, never raises)."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept on Linux
        self._listener.close()
        self._close_connections()

    # ---- its threads ---------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self._refusing or self._closed.is_set():
                sock.close()
                continue
            if not self._check(sock):
                self.rejected += 1
                (log.warning if self.rejected == 1 else log.debug)(
                    "port forward 127.0.0.1:%d: closed a connection from another user "
                    "(%d so far); it serves its own user only", self.port, self.rejected)
                _shut(sock)
                continue
            try:
                channel = open_channel(self._transport(), self.target, self._timeout)
            except Exception as exc:  # noqa: BLE001 - paramiko raises several kinds
                # Told first, so the owner has acted by the time the client sees the failure.
                self._tell(classify(exc), str(exc) or type(exc).__name__)
                sock.close()  # the client sees a closed connection at once
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(sock, channel)
            with self._lock:
                self._open.add(connection)
            if self._closed.is_set() or self._refusing:
                self._close_connections()
            name = f"skyward-forward-{self.port}-{channel.get_id()}"
            threading.Thread(target=self._to_target, args=(connection,), daemon=True,
                             name=f"{name}-out").start()
            threading.Thread(target=self._from_target, args=(connection,), daemon=True,
                             name=f"{name}-in").start()

    def _to_target(self, connection: _Connection) -> None:
        try:
            while data := connection.sock.recv(_CHUNK):
                connection.channel.sendall(data)
            connection.client_done = True
            connection.channel.shutdown_write()  # the client is done sending: pass it on
        except (OSError, EOFError, paramiko.SSHException):
            self._forget(connection)

    def _from_target(self, connection: _Connection) -> None:
        try:
            while data := connection.channel.recv(_CHUNK):
                connection.sock.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        # The far end ended a connection the client had not ended: it may have died.
        by_target = not connection.client_done
        if self._forget(connection) and by_target and not self._refusing:
            self._tell(Trouble.CLOSED_BY_TARGET, "the far end closed a connection")

    def _tell(self, trouble: Trouble, detail: str) -> None:
        try:
            self._on_trouble(trouble, detail)
        except Exception:  # the forward must outlive its owner's bugs
            log.exception("port %d: handling %s failed", self.port, trouble.value)

    def _forget(self, connection: _Connection) -> bool:
        """Close one connection's two ends; False when it was closed already (by ``close``,
        ``refuse`` or its other thread)."""
        with self._lock:
            mine = connection in self._open
            self._open.discard(connection)
        connection.close()
        return mine and not self._closed.is_set()

    def _close_connections(self) -> None:
        with self._lock:
            connections, self._open = list(self._open), set()
        for connection in connections:
            connection.close()


class _Connection:
    """One forwarded connection: the client's socket and its channel."""

    def __init__(self, sock: socket.socket, channel: paramiko.Channel) -> None:
        self.sock, self.channel = sock, channel
        #: The client sent EOF first: the far end's EOF that follows is the normal end.
        self.client_done = False

    def close(self) -> None:
        _shut(self.sock)
        # Its transport may be gone already (the node's connection closed): nothing to tell.
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.channel.close()


def _shut(sock: socket.socket) -> None:
    """Close a socket another thread may be blocked reading (shutdown wakes it first)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
