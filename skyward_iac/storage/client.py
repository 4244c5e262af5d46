"""``Storage``: a small client for S3-compatible object stores (AWS S3, R2, GCS, Wasabi, B2...).

Built on boto3 because it is the best-kept S3 client there is (AWS maintains it, every
S3-compatible vendor tests against it), because its transfer manager (s3transfer) already does
multipart uploads and ranged parallel downloads through ``TransferConfig``, and because
``endpoint_url`` points it at any S3-compatible endpoint. boto3 is imported on first use only,
so nodes can import this package without it.

    with sky.storage.S3(region="us-east-1") as s3:
        s3.upload("my-bucket", "model.pt", key="checkpoints/model.pt")
        s3.download("my-bucket", "checkpoints/model.pt", "local/model.pt")

Errors are ``StorageError`` subclasses naming the bucket, the key and the cause:
``BucketNotFoundError``, ``ObjectNotFoundError`` (also a ``FileNotFoundError``) and
``StorageAccessDeniedError`` (also a ``PermissionError``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeAlias

from skyward_iac.api.errors import (
    BucketNotFoundError,
    ObjectNotFoundError,
    StorageAccessDeniedError,
    StorageError,
)
from skyward_iac.api.storage import MiB, StorageEndpoint

log = logging.getLogger("skyward.storage")

#: boto3's S3 client (typed loosely: its stubs are a separate package).
S3Client: TypeAlias = Any

#: A progress line every this fraction of a large transfer.
PROGRESS_STEP = 0.25

_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403",
           "Forbidden", "AllAccessDisabled", "InvalidToken", "ExpiredToken"}


@dataclass(slots=True)
class _Session:
    """The open client behind a ``with storage:`` block (mutable, so outside the frozen value)."""

    lock: Any = field(default_factory=threading.Lock)
    client: Any = None
    depth: int = 0

    def __reduce__(self) -> tuple[type[_Session], tuple[()]]:
        # A copy (pickle, deepcopy) of a Storage starts closed: clients and locks stay here.
        return (_Session, ())


@dataclass(frozen=True, slots=True)
class Storage(StorageEndpoint):
    """An S3-compatible object store (``StorageEndpoint``'s fields) and a client for it.

    ``access_key``/``secret_key`` are strings or functions returning (or awaiting) them, called
    when a ``with`` block opens; without them boto3's own chain is used (environment, profile,
    instance role). ``path_style`` addresses buckets as ``endpoint/bucket`` (needed by MinIO,
    moto and most self-hosted servers). ``region`` signs requests (SigV4) for endpoints that
    check it. Files of ``part_size`` or more move in parts of that size, ``concurrency`` at once.
    """

    _session: _Session = field(default_factory=_Session, init=False, repr=False, compare=False)

    # -- context manager -----------------------------------------------------------------------

    def __enter__(self) -> Self:
        with self._session.lock:
            if self._session.depth == 0:
                self._session.client = self._connect()
            self._session.depth += 1
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._session.lock:
            self._session.depth -= 1
            if self._session.depth == 0:
                client, self._session.client = self._session.client, None
                client.close()

    @contextmanager
    def _client(self) -> Iterator[S3Client]:
        # Outside a ``with`` block a call opens (and closes) a client of its own.
        with self._session.lock:
            client = self._session.client
        if client is not None:
            yield client
            return
        with self:
            yield self._session.client

    def _connect(self) -> S3Client:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise StorageError("sky.Storage needs boto3: pip install boto3") from None
        keys = self.keys()
        config = Config(
            s3={"addressing_style": "path" if self.path_style else "auto"},
            retries={"max_attempts": 5, "mode": "standard"},
            connect_timeout=10, read_timeout=60,
            max_pool_connections=max(10, self.concurrency * 2),
        )
        session = boto3.session.Session()
        return session.client(
            "s3", endpoint_url=self.endpoint, region_name=self.region or "us-east-1",
            aws_access_key_id=keys[0] if keys else None,
            aws_secret_access_key=keys[1] if keys else None,
            config=config,
        )

    def _transfer_config(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(multipart_threshold=self.part_size,
                              multipart_chunksize=self.part_size,
                              max_concurrency=self.concurrency, use_threads=True)

    # -- operations ----------------------------------------------------------------------------

    def upload(self, bucket: str, local_path: str | os.PathLike[str], *,
               key: str | None = None) -> str:
        """Upload a file; ``key`` defaults to the file's name. Returns the key."""
        path = Path(local_path)
        if not path.is_file():
            raise StorageError(f"cannot upload {str(path)!r} to bucket {bucket!r}: no such file",
                               bucket=bucket, key=key)
        key = key if key is not None else path.name
        size = path.stat().st_size
        with self._client() as client, self._errors("upload", bucket, key):
            client.upload_file(str(path), bucket, key, Config=self._transfer_config(),
                               Callback=self._progress("upload", bucket, key, size))
        return key

    def download(self, bucket: str, key: str, local_path: str | os.PathLike[str]) -> Path:
        """Download an object to ``local_path`` (parents created). Returns the path.

        The file appears whole or not at all: s3transfer writes a temporary file and renames it.
        """
        path = Path(local_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._client() as client, self._errors("download", bucket, key):
            size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
            client.download_file(bucket, key, str(path), Config=self._transfer_config(),
                                 Callback=self._progress("download", bucket, key, size))
        return path

    def ls(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key in ``bucket`` that starts with ``prefix``, sorted."""
        keys: list[str] = []
        with self._client() as client, self._errors("list", bucket, None):
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                         Prefix=prefix):
                keys.extend(item["Key"] for item in page.get("Contents", ()))
        return sorted(keys)

    def exists(self, bucket: str, key: str) -> bool:
        """Whether ``key`` is in ``bucket``; a missing bucket raises ``BucketNotFoundError``."""
        try:
            with self._client() as client, self._errors("look up", bucket, key):
                client.head_object(Bucket=bucket, Key=key)
        except ObjectNotFoundError:
            return False
        return True

    def rm(self, bucket: str, key: str) -> None:
        """Delete ``key``; deleting a key that is not there is not an error (as in S3)."""
        with self._client() as client, self._errors("delete", bucket, key):
            client.delete_object(Bucket=bucket, Key=key)

    # -- errors and progress -------------------------------------------------------------------

    @contextmanager
    def _errors(self, action: str, bucket: str, key: str | None) -> Iterator[None]:
        """Turn botocore's errors into ``StorageError``s that say what and why."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        where = f"s3://{bucket}/{key}" if key is not None else f"bucket {bucket!r}"
        try:
            yield
        except ClientError as exc:
            raise self._client_error(exc, action, bucket, key, where) from None
        except S3UploadFailedError as exc:
            # boto3 wraps the failed part's ClientError; the cause is in there.
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ClientError):
                raise self._client_error(cause, action, bucket, key, where) from None
            raise StorageError(f"cannot {action} {where} at {self.endpoint}: {exc}",
                               bucket=bucket, key=key) from None
        except NoCredentialsError:
            raise StorageAccessDeniedError(
                f"cannot {action} {where} at {self.endpoint}: no credentials; pass access_key "
                "and secret_key, or configure AWS credentials", bucket=bucket, key=key,
            ) from None
        except BotoCoreError as exc:
            raise StorageError(f"cannot {action} {where} at {self.endpoint}: {exc}",
                               bucket=bucket, key=key) from None

    def _client_error(self, exc: Any, action: str, bucket: str, key: str | None,
                      where: str) -> StorageError:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return self._missing_bucket(bucket, key)
        if code in ("NoSuchKey", "404", "NotFound") or status == 404:
            # A HEAD answers a bare 404 for a missing bucket too: ask about the bucket.
            if key is None or not self._bucket_exists(bucket):
                return self._missing_bucket(bucket, key)
            return ObjectNotFoundError(f"cannot {action} {where}: no such key in bucket "
                                       f"{bucket!r} at {self.endpoint}", bucket=bucket, key=key)
        if code in _DENIED or status == 403:
            return StorageAccessDeniedError(
                f"cannot {action} {where}: access denied by {self.endpoint} ({code or status}); "
                "check the keys and that they may use this bucket", bucket=bucket, key=key)
        message = error.get("Message") or code or str(status)
        return StorageError(f"cannot {action} {where} at {self.endpoint}: {message}",
                            bucket=bucket, key=key)

    def _missing_bucket(self, bucket: str, key: str | None) -> BucketNotFoundError:
        return BucketNotFoundError(
            f"bucket {bucket!r} does not exist at {self.endpoint}; check the name or create it",
            bucket=bucket, key=key)

    def _bucket_exists(self, bucket: str) -> bool:
        from botocore.exceptions import ClientError

        with self._client() as client:
            try:
                client.head_bucket(Bucket=bucket)
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                return status != 404
        return True

    def _progress(self, action: str, bucket: str, key: str,
                  size: int) -> Callable[[int], None] | None:
        """A transfer callback that logs every ``PROGRESS_STEP`` of a large transfer."""
        if size < self.part_size:
            return None
        return _Progress(f"{action} s3://{bucket}/{key}", size)


class _Progress:
    """Counts bytes from s3transfer's worker threads and logs a line per step."""

    def __init__(self, what: str, size: int) -> None:
        self.what, self.size = what, size
        self.done = 0
        self.next_step = PROGRESS_STEP
        self.started = time.monotonic()
        self.lock = threading.Lock()
        log.info("%s: %.1f MiB", what, size / MiB)

    def __call__(self, transferred: int) -> None:
        with self.lock:
            self.done += transferred
            fraction = self.done / self.size if self.size else 1.0
            if fraction + 1e-9 < self.next_step:
                return
            while self.next_step <= fraction + 1e-9:
                self.next_step += PROGRESS_STEP
            elapsed = max(time.monotonic() - self.started, 1e-6)
            log.info("%s: %.1f/%.1f MiB (%d%%, %.1f MiB/s)", self.what, self.done / MiB,
                     self.size / MiB, round(fraction * 100), self.done / MiB / elapsed)
