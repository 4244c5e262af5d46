"""``sky.Storage`` against a real S3-compatible server (moto's server mode on loopback)."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from pathlib import Path

import boto3
import pytest

from skyward_iac.api.errors import (
    BucketNotFoundError,
    ObjectNotFoundError,
    SkywardError,
    StorageAccessDeniedError,
    StorageError,
)
from skyward_iac.api.storage import MiB
from skyward_iac.storage import Storage
from tests.s3_server import (  # noqa: F401 - shared pytest fixtures
    S3Server,
    s3_server,
)

pytestmark = pytest.mark.integration


@pytest.fixture()
def bucket(server: S3Server) -> str:
    """A fresh bucket per test (the Storage API creates none: buckets are the user's)."""
    name = f"test-{secrets.token_hex(4)}"
    raw(server).create_bucket(Bucket=name)
    return name


def raw(server: S3Server) -> object:
    return boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                        aws_access_key_id=server.access_key,
                        aws_secret_access_key=server.secret_key)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(MiB), b""):
            digest.update(block)
    return digest.hexdigest()


def test_every_method_round_trips(storage: Storage, bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "weights.bin"
    source.write_bytes(b"w" * 1000)
    with storage as s3:
        assert s3 is storage
        assert s3.upload(bucket, source) == "weights.bin"  # key defaults to the file name
        assert s3.upload(bucket, source, key="runs/a/weights.bin") == "runs/a/weights.bin"
        assert s3.upload(bucket, source, key="runs/b/weights.bin") == "runs/b/weights.bin"
        assert s3.ls(bucket) == ["runs/a/weights.bin", "runs/b/weights.bin", "weights.bin"]
        assert s3.ls(bucket, prefix="runs/a/") == ["runs/a/weights.bin"]
        assert s3.exists(bucket, "runs/a/weights.bin")
        assert not s3.exists(bucket, "runs/c/weights.bin")
        target = s3.download(bucket, "runs/a/weights.bin", tmp_path / "out" / "w.bin")
        assert target.read_bytes() == source.read_bytes()
        s3.rm(bucket, "runs/a/weights.bin")
        assert not s3.exists(bucket, "runs/a/weights.bin")
        s3.rm(bucket, "runs/a/weights.bin")  # deleting what is gone is not an error, as in S3
        assert s3.ls(bucket, prefix="runs/") == ["runs/b/weights.bin"]


def test_methods_work_outside_a_with_block(storage: Storage, bucket: str,
                                           tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    storage.upload(bucket, tmp_path / "a.txt")
    assert storage.ls(bucket) == ["a.txt"]


def test_keys_may_be_functions_or_coroutines(server: S3Server, bucket: str,
                                             tmp_path: Path) -> None:
    async def secret() -> str:
        return server.secret_key

    storage = Storage(server.endpoint, access_key=lambda: server.access_key, secret_key=secret,
                      path_style=True)
    (tmp_path / "k.txt").write_text("k")
    with storage as s3:
        s3.upload(bucket, tmp_path / "k.txt")
        assert s3.exists(bucket, "k.txt")
    assert storage.keys() == (server.access_key, server.secret_key)


def test_large_file_goes_up_and_down_in_parts(storage: Storage, server: S3Server, bucket: str,
                                              tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    source = tmp_path / "big.bin"
    with source.open("wb") as file:
        for _ in range(40):
            file.write(os.urandom(MiB))
    caplog.set_level(logging.INFO, logger="skyward")
    with storage as s3:  # the default part size: 8 MiB
        s3.upload(bucket, source, key="big/model.bin")
        target = s3.download(bucket, "big/model.bin", tmp_path / "back.bin")
    assert sha256(target) == sha256(source)
    # A multipart object's ETag ends in "-<number of parts>": 40 MiB / 8 MiB = 5 parts.
    etag = raw(server).head_object(Bucket=bucket, Key="big/model.bin")["ETag"]  # type: ignore[attr-defined]
    assert etag.strip('"').endswith("-5")
    progress = [r.getMessage() for r in caplog.records if r.name == "skyward.storage"]
    assert any("upload s3://" in m and "(100%" in m for m in progress), progress
    assert any("download s3://" in m and "(100%" in m for m in progress), progress
    assert not any(server.secret_key in m for m in caplog.messages)


def test_missing_key_names_bucket_and_key(storage: Storage, bucket: str,
                                          tmp_path: Path) -> None:
    with storage as s3, pytest.raises(ObjectNotFoundError) as caught:
        s3.download(bucket, "nope/model.pt", tmp_path / "model.pt")
    error = caught.value
    assert isinstance(error, FileNotFoundError) and isinstance(error, SkywardError)
    assert (error.bucket, error.key) == (bucket, "nope/model.pt")
    assert f"s3://{bucket}/nope/model.pt" in str(error) and "no such key" in str(error)
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.parametrize("call", ["ls", "exists", "download", "upload", "rm"])
def test_missing_bucket_is_named(storage: Storage, tmp_path: Path, call: str) -> None:
    (tmp_path / "f").write_text("f")
    calls = {
        "ls": lambda s: s.ls("no-such-bucket"),
        "exists": lambda s: s.exists("no-such-bucket", "k"),
        "download": lambda s: s.download("no-such-bucket", "k", tmp_path / "k"),
        "upload": lambda s: s.upload("no-such-bucket", tmp_path / "f"),
        "rm": lambda s: s.rm("no-such-bucket", "k"),
    }
    with storage as s3, pytest.raises(BucketNotFoundError) as caught:
        calls[call](s3)
    assert caught.value.bucket == "no-such-bucket"
    assert "bucket 'no-such-bucket' does not exist" in str(caught.value)


def test_upload_of_a_missing_file(storage: Storage, bucket: str, tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="no such file"):
        storage.upload(bucket, tmp_path / "absent.bin")


def test_refused_keys_are_access_denied(tmp_path: Path) -> None:
    # With auth on, moto knows no keys at all: every request is refused like a wrong key.
    with s3_server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as strict:
        storage = Storage(strict.endpoint, access_key="AKIAWRONG", secret_key="wrong-secret",
                          path_style=True)
        with storage as s3, pytest.raises(StorageAccessDeniedError) as caught:
            s3.ls("private-data")
    assert isinstance(caught.value, PermissionError)
    assert "access denied" in str(caught.value) and "private-data" in str(caught.value)
    assert "wrong-secret" not in str(caught.value)


def test_secrets_stay_out_of_reprs(server: S3Server) -> None:
    storage = Storage(server.endpoint, access_key="AKID", secret_key="very-secret", path_style=True)
    assert "very-secret" not in repr(storage) and "AKID" not in repr(storage)


def test_hyperstack_mints_one_key_pair_through_its_api(server: S3Server, bucket: str) -> None:
    """The Hyperstack preset asks the Hyperstack API (a loopback stand-in here) for a key pair
    once, then talks S3 with it."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from skyward_iac.storage import presets as storage_presets

    calls: list[tuple[str, str, str | None, dict[str, object]]] = []

    class HyperstackAPI(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(("POST", self.path, self.headers.get("api_key"), body))
            answer = json.dumps({"id": 7, "access_key": server.access_key,
                                 "secret_key": server.secret_key, "region": "CANADA-1"}).encode()
            self.send_response(201)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    api = ThreadingHTTPServer(("127.0.0.1", 0), HyperstackAPI)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    try:
        storage = storage_presets.Hyperstack(
            api_key="hs-api-key", endpoint=server.endpoint,
            api_url=f"http://127.0.0.1:{api.server_address[1]}/v1")
        assert calls == []  # nothing is minted until a client opens
        with storage as s3:
            assert s3.ls(bucket) == []
        assert storage.keys() == (server.access_key, server.secret_key)
    finally:
        api.shutdown()
        api.server_close()
    assert len(calls) == 1
    method, path, api_key, body = calls[0]
    assert (method, path, api_key, body["region"]) == (
        "POST", "/v1/object-storage/access-keys", "hs-api-key", "CANADA-1")
