"""A real S3-compatible server for tests: moto's server mode in its own process on loopback.

moto answers the S3 REST API over HTTP like any S3-compatible store (path-style addressing, any
keys accepted), so the Storage client and the FUSE mounters talk to it exactly as to a cloud.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from skyward_iac.storage import Storage

ACCESS_KEY = "skyward-test-access"
SECRET_KEY = "skyward-test-secret-0123456789"


@dataclass(frozen=True, slots=True)
class S3Server:
    """A running server: its endpoint URL and the keys clients should use."""

    endpoint: str
    pid: int
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@contextmanager
def s3_server(host: str = "127.0.0.1", timeout: float = 30.0,
              env: dict[str, str] | None = None) -> Iterator[S3Server]:
    """Start ``python -m moto.server`` on a free loopback port; stop it (and its children).

    ``env`` adds environment variables, e.g. ``INITIAL_NO_AUTH_ACTION_COUNT=0`` makes moto
    check keys like a real store (then unknown keys are refused).
    """
    port = free_port(host)
    # moto logs a line per request on stderr: a pipe nobody reads fills after ~600 requests
    # and the server blocks mid-request (an engine command then hangs), so it goes to a file.
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
        start_new_session=True,  # its own group: the stop below reaches any reloader child
    )
    endpoint = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"moto server exited: {log.read().decode()}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto not ready on {endpoint} in {timeout}s") from None
                time.sleep(0.1)
        yield S3Server(endpoint, process.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture(scope="session")
def server() -> Iterator[S3Server]:
    """A real local S3-compatible server for the session (imported by the tests that use it)."""
    with s3_server() as running:
        yield running


@pytest.fixture()
def storage(server: S3Server) -> Storage:
    """A Storage client for ``server`` with its keys."""
    return Storage(server.endpoint, access_key=server.access_key, secret_key=server.secret_key,
                   path_style=True)


def team_state_env(server: S3Server, bucket: str) -> dict[str, str]:
    """What points a skyward home at a shared state on ``server``: a new ``bucket`` as the
    backend and a new KMS key as the secrets provider (moto speaks both)."""
    import boto3

    client = {"endpoint_url": server.endpoint, "region_name": "us-east-1",
              "aws_access_key_id": server.access_key,
              "aws_secret_access_key": server.secret_key}
    boto3.client("s3", **client).create_bucket(Bucket=bucket)
    key = boto3.client("kms", **client).create_key()["KeyMetadata"]["KeyId"]
    host = server.endpoint.removeprefix("http://")
    return {
        "SKYWARD_BACKEND_URL": f"s3://{bucket}?endpoint={host}&s3ForcePathStyle=true"
                               "&disableSSL=true&region=us-east-1",
        "SKYWARD_SECRETS_PROVIDER": f"awskms://{key}?region=us-east-1&awssdk=v2",
        "AWS_ENDPOINT_URL_KMS": server.endpoint, "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key,
    }
