"""The worker agent: one persistent process per node that runs tasks sent by the client.

It listens on the node's loopback only (the client reaches it through an SSH direct-tcpip
channel) and demands the per-stack token as the first frame, before it unpickles anything.
Run as ``python -m skyward_iac.remote.agent --token-file F --port-file F [--concurrency N]``.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import signal
import socket
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cloudpickle

from skyward_iac.remote import protocol
from skyward_iac.remote.protocol import Cancel, Failure, Result, Task, Welcome

HANDSHAKE_TIMEOUT = 10.0
log = logging.getLogger("skyward.agent")


def describe_failure(exc: BaseException) -> Failure:
    """Capture an exception for the client: pickled when possible, always with its traceback."""
    try:
        pickled: bytes | None = protocol.dumps(exc)
        cloudpickle.loads(pickled)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        pickled = None
    kind = type(exc)
    return Failure(
        type_name=f"{kind.__module__}.{kind.__qualname__}",
        message=str(exc),
        traceback="".join(traceback.format_exception(exc)),
        exception=pickled,
    )


def run_task(task: Task) -> Result:
    """Unpickle and call a task's function; never raises."""
    try:
        fn, args, kwargs = cloudpickle.loads(task.payload)
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the client
        return Result(task.task_id, failure=describe_failure(exc))
    try:
        return Result(task.task_id, value=protocol.dumps(value))
    except Exception as exc:
        wrapped = TypeError(f"the result of {task.name} cannot be pickled: {exc}")
        return Result(task.task_id, failure=describe_failure(wrapped))


class Connection:
    """One authenticated client connection: reads tasks, sends results as they finish."""

    def __init__(self, sock: socket.socket, executor: ThreadPoolExecutor, node: int) -> None:
        self.sock = sock
        self.executor = executor
        self.node = node
        self.send_lock = threading.Lock()
        self.cancelled: set[int] = set()

    def send(self, message: object) -> None:
        frames = protocol.encode(message)
        with self.send_lock:
            protocol.send(self.sock, frames)

    def finish(self, task: Task) -> None:
        result = run_task(task)
        if task.task_id in self.cancelled:
            self.cancelled.discard(task.task_id)
            return
        try:
            self.send(result)
        except OSError:
            log.warning("client gone before result of task %s", task.task_id)

    def serve(self) -> None:
        while True:
            message = protocol.read_message(self.sock)
            if isinstance(message, Task):
                self.executor.submit(self.finish, message)
            elif isinstance(message, Cancel):
                self.cancelled.add(message.task_id)


def authenticate(sock: socket.socket, token: bytes) -> bool:
    """True when the first frame is exactly the token; nothing is unpickled before this."""
    sock.settimeout(HANDSHAKE_TIMEOUT)
    try:
        flags, payload = protocol.read_frame(sock)
    except (OSError, protocol.ConnectionClosed, ValueError):
        return False
    sock.settimeout(None)
    return flags == protocol.RAW and hmac.compare_digest(payload, token)


def handle(sock: socket.socket, token: bytes, executor: ThreadPoolExecutor, node: int) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with sock:
        if not authenticate(sock, token):
            log.warning("rejected a connection without the stack token")
            return
        connection = Connection(sock, executor, node)
        connection.send(Welcome(node=node, pid=os.getpid(), python=sys.version.split()[0]))
        try:
            connection.serve()
        except (protocol.ConnectionClosed, OSError):
            log.info("client disconnected")


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--node", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    token = args.token_file.read_bytes().strip()
    server = socket.create_server((args.bind, 0), backlog=64)
    executor = ThreadPoolExecutor(max_workers=args.concurrency, thread_name_prefix="task")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    write_atomically(args.port_file, str(server.getsockname()[1]))
    log.info("agent of node %s listening on %s", args.node, server.getsockname())
    while True:
        sock, _ = server.accept()
        threading.Thread(
            target=handle, args=(sock, token, executor, args.node), daemon=True
        ).start()


if __name__ == "__main__":
    main()
