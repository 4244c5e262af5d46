"""The floor: a bare loopback TCP worker. No SSH, no scheduler, no retries: length-prefixed
pickles (protocol 5, functions by reference) over one TCP_NODELAY connection per worker.

Run as a worker: ``python bench/tcp_floor.py PORT_FILE`` (listens on 127.0.0.1, one client).
"""

from __future__ import annotations

import pickle
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LENGTH = struct.Struct("!Q")


def _send(sock: socket.socket, obj: Any) -> None:
    payload = pickle.dumps(obj, protocol=5)
    if len(payload) < 65536:
        sock.sendall(LENGTH.pack(len(payload)) + payload)
    else:
        sock.sendall(LENGTH.pack(len(payload)))
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if not n:
            raise EOFError("peer closed")
        got += n
    return buffer


def _recv(sock: socket.socket) -> Any:
    (size,) = LENGTH.unpack(_recv_exact(sock, LENGTH.size))
    return pickle.loads(_recv_exact(sock, size))


def serve(port_file: Path) -> None:
    """Accept one client and answer ``(fn, args)`` frames with ``fn(*args)`` until it leaves."""
    server = socket.create_server(("127.0.0.1", 0))
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(server.getsockname()[1]))
    tmp.replace(port_file)
    sock, _ = server.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            fn, args = _recv(sock)
            _send(sock, fn(*args))
    except EOFError:
        return


class TcpFloor:
    """``workers`` worker processes, each reached over its own loopback connection."""

    name = "tcp-floor"

    def __init__(self) -> None:
        self._processes: list[subprocess.Popen[bytes]] = []
        self._socks: list[socket.socket] = []
        self._folder: Path | None = None

    def start(self, workers: int = 2) -> None:
        folder = self._folder = Path(tempfile.mkdtemp(prefix="skyward-bench-floor-"))
        files = [folder / f"port-{i}" for i in range(workers)]
        self._processes = [subprocess.Popen([sys.executable, __file__, str(f)]) for f in files]
        for file in files:
            while not file.exists():
                time.sleep(0.005)
            sock = socket.create_connection(("127.0.0.1", int(file.read_text())))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks.append(sock)

    def stop(self) -> None:
        for sock in self._socks:
            sock.close()
        for process in self._processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._socks, self._processes = [], []
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        _send(self._socks[0], (fn, args))
        return _recv(self._socks[0])

    def map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """Round-robin over the workers; a sender thread per worker keeps its pipe full."""
        count = len(self._socks)
        shares = [items[i::count] for i in range(count)]
        def send_all(sock: socket.socket, share: list[Any]) -> None:
            for item in share:
                _send(sock, (fn, (item,)))

        senders = [threading.Thread(target=send_all, args=(sock, share))
                   for sock, share in zip(self._socks, shares)]
        for sender in senders:
            sender.start()
        answers: list[list[Any]] = [[None] * len(share) for share in shares]

        def read(worker: int) -> None:
            for position in range(len(shares[worker])):
                answers[worker][position] = _recv(self._socks[worker])

        readers = [threading.Thread(target=read, args=(w,)) for w in range(count)]
        for thread in readers:
            thread.start()
        for thread in readers + senders:
            thread.join()
        results: list[Any] = [None] * len(items)
        for worker, share_answers in enumerate(answers):
            results[worker::count] = share_answers
        return results


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
