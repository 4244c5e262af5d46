"""Starts, health-checks and stops the head node's etcd, detached from whoever launched it.

Run on the head node (usually over SSH)::

    python -m skyward_iac.node etcd-server --data-dir D --listen ADDR \\
        --client-port P --peer-port Q --certs-dir C [--timeout S] [--certs-stdin] [--durable]
        [--etcd-bin PATH] [--local-socket]

It prints exactly one line, ``::etcd-endpoint host:port``, once etcd's ``/health`` (a read
through raft) answers over mutual TLS, and exits 0; etcd keeps running in its own session. Otherwise it exits
non-zero and prints the tail of etcd's log on stderr. Running it again against a live data dir only
re-checks health (idempotent bootstrap). ``stop(data_dir)`` ends it.

Layout of the data dir (0700): ``etcd/`` (etcd's own data), ``etcd.log`` (its stdout and
stderr), ``etcd.pid``. The certificate directory (0700) holds ``ca.crt``, ``server.crt`` and
``server.key``, each 0600; ``--certs-stdin`` writes them from a JSON object
``{"ca_pem": ..., "cert_pem": ..., "key_pem": ...}`` read on stdin, so the key never appears on
a command line.

Which etcd binary runs: node/etcd_binary.py (one line on stderr names it and its version).
etcd 3.6+ is faster for the collections: its client port then serves gRPC alone
(``http_listener_flags``), with about a third less of etcd's CPU per request.

``--local-socket`` (Local heads: every node is on this machine, as this user) adds a plain
gRPC listener on a unix socket in the data dir (``GRPC_SOCKET``; the dir is 0700), which the
tasks of a Local pool use instead of loopback TCP with TLS (collections/unix_endpoint.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skyward_iac.node import etcd_health
from skyward_iac.node.etcd_binary import (  # noqa: F401 - ETCD_BIN_ENV: part of this API
    ETCD_BIN_ENV,
    etcd_binary,
    etcd_version,
    etcd_version_text,
    major_minor,
)
from skyward_iac.processes import is_alive

if TYPE_CHECKING:
    # Not imported at run time: skyward_iac.collections loads gRPC, pyetcd and cryptography,
    # which this launcher needs none of (its health check is stdlib HTTPS).
    from skyward_iac.collections.pki import IssuedCertificate

ENDPOINT_LINE = "::etcd-endpoint"
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "server.crt", "server.key"
#: The name etcd's certificate carries (collections.pki.SERVER_NAME; not imported, see above).
SERVER_NAME = "skyward-etcd"
_PID_FILE, _LOG_FILE, _ETCD_DIR = "etcd.pid", "etcd.log", "etcd"
#: Where etcd 3.6+ serves its HTTP endpoints (health, metrics, the JSON gateway: the
#: collections use none of them): a unix socket in the data dir, etcd's working directory, so
#: this listener is never on the network. (etcd names the file after the URL's host:port.)
HTTP_SOCKET = "etcd-http:0"
#: Where a Local head's etcd also serves gRPC, plain: a unix socket in its 0700 data dir (etcd's
#: working directory), reachable only by its user (the nodes of a Local pool all run as it).
GRPC_SOCKET = "etcd-grpc:0"


class EtcdStartError(RuntimeError):
    """etcd did not become healthy; the message ends with the tail of its log."""


@dataclass(frozen=True, slots=True)
class EtcdServer:
    """A running etcd: where clients reach it and how to find the process again."""

    endpoint: str
    pid: int
    data_dir: Path

    @property
    def log_path(self) -> Path:
        """etcd's combined stdout/stderr."""
        return self.data_dir / _LOG_FILE


def http_listener_flags(version: tuple[int, int] | None) -> list[str]:
    """etcd flags that move its HTTP endpoints off the client port, where etcd can do that.

    While HTTP and gRPC share a TLS port, etcd serves gRPC through Go's net/http server
    (3.5 always does); alone on the port, gRPC runs on grpc-go's own transport. Measured in
    turns (bench/collection_ab.py, etcd 3.6.16 both ways): etcd's CPU per lock, queue and
    counter operation 1.32, 1.23 and 0.49 ms against 1.67, 1.79 and 0.74 with the port shared,
    and 17-40% more operations per second."""
    if version is None or version < (3, 6):
        return []
    return [f"--listen-client-http-urls=unixs://{HTTP_SOCKET}"]


def write_certificates(certs_dir: Path, server: IssuedCertificate) -> None:
    """Writes the CA certificate and etcd's pair into ``certs_dir`` (0700), each file 0600."""
    _write_pems(certs_dir, server.ca_pem, server.cert_pem, server.key_pem)


def _write_pems(certs_dir: Path, ca_pem: str, cert_pem: str, key_pem: str) -> None:
    certs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(certs_dir, 0o700)
    for name, text in ((CA_FILE, ca_pem), (CERT_FILE, cert_pem), (KEY_FILE, key_pem)):
        path = certs_dir / name
        # Create with 0600 from the first byte: no window where the key is world-readable.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(path, 0o600)


def _check_certificates(certs_dir: Path) -> None:
    """FileNotFoundError naming the first of the files :func:`write_certificates` writes that
    is missing."""
    for name in (CA_FILE, CERT_FILE, KEY_FILE):
        if not (certs_dir / name).is_file():
            raise FileNotFoundError(
                f"{certs_dir / name} is missing: write the stack's certificates first "
                "(write_certificates or --certs-stdin)"
            )


def etcd_command(
    data_dir: Path, *, listen: str, client_port: int, peer_port: int, certs_dir: Path,
    name: str = "skyward", durable: bool = False, binary: str | None = None,
    local_socket: bool = False, version: str | None = None,
) -> list[str]:
    """etcd's argument list: one member, mutual TLS on both the client and the peer port;
    ``local_socket``: plain gRPC on ``GRPC_SOCKET`` in the data dir too."""
    host = _advertised(listen)
    client_url = f"https://{_bracket(host)}:{client_port}"
    peer_url = f"https://{_bracket(host)}:{peer_port}"
    ca, cert, key = (str(certs_dir / f) for f in (CA_FILE, CERT_FILE, KEY_FILE))
    binary = binary or etcd_binary()[0]
    # A relative unix URL: etcd binds it in its working directory, the data dir (no 107-byte
    # sun_path limit on however deep the workdir is).
    socket_url = f",unix://{GRPC_SOCKET}" if local_socket else ""
    command = [
        binary,
        f"--name={name}",
        f"--data-dir={data_dir / _ETCD_DIR}",
        f"--listen-client-urls=https://{_bracket(listen)}:{client_port}{socket_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls=https://{_bracket(listen)}:{peer_port}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster={name}={peer_url}",
        "--initial-cluster-state=new",
        f"--cert-file={cert}", f"--key-file={key}",
        "--client-cert-auth", f"--trusted-ca-file={ca}",
        f"--peer-cert-file={cert}", f"--peer-key-file={key}",
        "--peer-client-cert-auth", f"--peer-trusted-ca-file={ca}",
        # Counters and queues write a revision per operation; keep history bounded.
        "--auto-compaction-mode=periodic", "--auto-compaction-retention=10m",
        # Values are cloudpickled objects; etcd's 1.5 MiB default is tight for cached arrays.
        "--max-request-bytes=16777216",
        "--log-level=warn",
        *http_listener_flags(major_minor(version) if version is not None
                             else etcd_version(binary)),
    ]
    if not durable:
        # Collections live and die with the job and with the head node's disk: an fsync per
        # write buys nothing here and caps throughput at the disk's flush rate.
        command.append("--unsafe-no-fsync")
    return command


def start(
    data_dir: Path,
    *,
    listen: str,
    client_port: int,
    peer_port: int,
    certs_dir: Path,
    timeout: float = 30.0,
    durable: bool = False,
    built: str | None = None,
    local_socket: bool = False,
    say: Callable[[str], object] = lambda line: print(line, file=sys.stderr, flush=True),
) -> EtcdServer:
    """Starts etcd detached (own session, outlives the caller) and waits until it is healthy.

    If the data dir's etcd is already running, it is only health-checked. Raises
    :class:`EtcdStartError` (with the log tail) when it is not healthy within ``timeout``.
    ``built``: the client's etcd build (see :func:`etcd_binary`); ``local_socket``: also serve
    gRPC on ``GRPC_SOCKET``; ``say`` hears which binary starts.
    """
    data_dir = data_dir.resolve()
    certs_dir = certs_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(data_dir, 0o700)  # etcd insists on 0700 for its data
    _check_certificates(certs_dir)
    endpoint = f"{_bracket(_advertised(listen))}:{client_port}"
    pid = running_pid(data_dir)
    if pid is None:
        # Else a foreign listener on the port would answer our health check in etcd's place.
        for port in (client_port, peer_port):
            _ensure_free(listen, port)
        binary, source = etcd_binary(built)
        version = etcd_version_text(binary)
        say(f"etcd {version or '(version unknown)'} from {source}: {binary}")
        command = etcd_command(data_dir, listen=listen, client_port=client_port,
                               peer_port=peer_port, certs_dir=certs_dir, durable=durable,
                               binary=binary, local_socket=local_socket, version=version)
        # A socket file left by an etcd that was killed would make this one fail to listen.
        for stale in (HTTP_SOCKET, GRPC_SOCKET):
            (data_dir / stale).unlink(missing_ok=True)
        log_fd = os.open(data_dir / _LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(log_fd, "ab") as log:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=data_dir, start_new_session=True, close_fds=True,
            )
        pid = process.pid
        (data_dir / _PID_FILE).write_text(f"{pid}\n")
    _wait_healthy(data_dir, pid, endpoint, certs_dir, timeout)
    return EtcdServer(endpoint=endpoint, pid=pid, data_dir=data_dir)


def check_health(data_dir: Path, endpoint: str, certs_dir: Path, timeout: float = 2.0) -> None:
    """etcd's ``/health`` over mutual TLS (node/etcd_health.py): on its HTTP socket in
    ``data_dir`` where it has one (3.6+), else on the client port ``endpoint``."""
    http_socket = data_dir / HTTP_SOCKET
    etcd_health.check(endpoint, http_socket if http_socket.exists() else None,
                      ca=certs_dir / CA_FILE, cert=certs_dir / CERT_FILE, key=certs_dir / KEY_FILE,
                      server_name=SERVER_NAME, timeout=timeout)


def running_pid(data_dir: Path) -> int | None:
    """Pid of the data dir's etcd if it is alive (and really that etcd), else None."""
    try:
        pid = int((data_dir / _PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    if not is_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return pid  # no /proc: trust the pid file
    # A recycled pid belongs to someone else: never signal it.
    return pid if str(data_dir.resolve() / _ETCD_DIR).encode() in cmdline else None


def stop(data_dir: Path, *, grace: float = 10.0) -> bool:
    """Stops the data dir's etcd (TERM, then KILL after ``grace``); True if one was running."""
    data_dir = data_dir.resolve()
    pid = running_pid(data_dir)
    if pid is None:
        return False
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and is_alive(pid):
            time.sleep(0.05)
        if not is_alive(pid):
            break
    if is_alive(pid):
        raise RuntimeError(f"etcd (pid {pid}) survived SIGKILL; look at {data_dir / _LOG_FILE}")
    (data_dir / _PID_FILE).unlink(missing_ok=True)
    return True


def log_tail(data_dir: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of etcd's log (empty if there is none)."""
    try:
        text = (data_dir / _LOG_FILE).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def main(argv: Sequence[str] | None = None) -> int:
    """The ``python -m skyward_iac.node etcd-server`` entry point."""
    parser = argparse.ArgumentParser(prog="python -m skyward_iac.node etcd-server",
                                     description="Start the collections' etcd, detached.")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--listen", required=True, help="address to bind, e.g. the private IP")
    parser.add_argument("--client-port", type=int, required=True)
    parser.add_argument("--peer-port", type=int, required=True)
    parser.add_argument("--certs-dir", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to become healthy")
    parser.add_argument("--certs-stdin", action="store_true",
                        help='read {"ca_pem","cert_pem","key_pem"} JSON on stdin into --certs-dir')
    parser.add_argument("--durable", action="store_true", help="keep etcd's fsync per write")
    parser.add_argument("--etcd-bin", help="the client's etcd build, as this node sees it "
                        "(used unless $SKYWARD_ETCD_BIN is set; skipped when not executable)")
    parser.add_argument("--local-socket", action="store_true",
                        help=f"also serve gRPC, plain, on {GRPC_SOCKET} in the data dir")
    args = parser.parse_args(argv)
    try:
        if args.certs_stdin:
            pems = json.load(sys.stdin)
            _write_pems(args.certs_dir, pems["ca_pem"], pems["cert_pem"], pems["key_pem"])
        server = start(args.data_dir, listen=args.listen, client_port=args.client_port,
                       peer_port=args.peer_port, certs_dir=args.certs_dir,
                       timeout=args.timeout, durable=args.durable, built=args.etcd_bin,
                       local_socket=args.local_socket)
    except (EtcdStartError, FileNotFoundError, KeyError, ValueError, OSError) as exc:
        print(f"etcd did not start: {exc}", file=sys.stderr)
        return 1
    print(f"{ENDPOINT_LINE} {server.endpoint}", flush=True)
    return 0


def _wait_healthy(data_dir: Path, pid: int, endpoint: str, certs_dir: Path,
                  timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_error = "no answer yet"
    while True:
        if not is_alive(pid):
            raise EtcdStartError(
                f"etcd (pid {pid}) exited during startup.\n--- {data_dir / _LOG_FILE} ---\n"
                f"{log_tail(data_dir)}"
            )
        try:
            check_health(data_dir, endpoint, certs_dir, timeout=min(2.0, max(timeout, 0.1)))
            if is_alive(pid):
                return
            continue  # it answered, then died: report the exit with its log
        except (OSError, ValueError) as exc:
            last_error = str(exc) or type(exc).__name__
        if time.monotonic() >= deadline:
            raise EtcdStartError(
                f"etcd (pid {pid}) was not healthy at {endpoint} within {timeout:g}s "
                f"({last_error}).\n--- {data_dir / _LOG_FILE} ---\n{log_tail(data_dir)}"
            )
        time.sleep(0.1)


def _ensure_free(listen: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in listen else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR: TIME_WAIT leftovers of a previous etcd are fine, a listener is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((listen, port))
        except OSError as exc:
            raise EtcdStartError(
                f"cannot bind {_bracket(listen)}:{port} ({exc.strerror}): another process listens "
                "there; pick other --client-port/--peer-port values or stop that process"
            ) from None


def _advertised(listen: str) -> str:
    # A wildcard bind is reachable on loopback; advertise that rather than an unroutable 0.0.0.0.
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(listen, listen)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host

