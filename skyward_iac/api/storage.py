"""What an S3-compatible object store is: its endpoint, keys and transfer settings, checked.

The pure half of ``sky.Storage`` (no I/O, as all of ``api/``): a ``Volume`` names its store
with it and the node mounts it. The client that moves objects, ``sky.Storage`` itself, and the
``sky.storage`` presets live in ``skyward_iac/storage/``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from skyward_iac.api.errors import ConfigError

#: A key given as text, or as a function returning it (``str``) or awaiting it (``async def``).
Credential: TypeAlias = str | Callable[[], str] | Callable[[], Awaitable[str]]
MiB = 1024 * 1024
#: Objects at least this large go up in parts, parallel and retried part by part.
DEFAULT_PART_SIZE = 8 * MiB
#: How many parts move at once.
DEFAULT_CONCURRENCY = 4
#: Google Cloud Storage's S3-compatible (XML API) endpoint.
GCS_ENDPOINT = "https://storage.googleapis.com"


def resolve_credential(value: Credential | None, what: str = "credential") -> str | None:
    """``value`` as text: a string as is, a function called, an awaitable awaited."""
    if value is None or isinstance(value, str):
        return value
    if not callable(value):
        raise ConfigError(f"{what} must be a string or a function returning one, got "
                          f"{type(value).__name__}")
    result: Any = value()
    if inspect.isawaitable(result):
        result = _await(result)
    if not isinstance(result, str):
        raise ConfigError(f"{what} function returned {type(result).__name__}, not a string")
    return result


def _await(awaitable: Awaitable[Any]) -> Any:
    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    # Called from inside a running loop (a notebook, an async app): that loop cannot be
    # blocked on, so the awaitable runs on a loop of its own in a helper thread.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()


@dataclass(frozen=True, slots=True)
class StorageEndpoint:
    """An S3-compatible object store: an endpoint and, optionally, its keys (``sky.Storage``
    is this with the client that moves objects).

    ``access_key``/``secret_key`` are strings or functions returning (or awaiting) them, called
    when a ``with`` block opens; without them boto3's own chain is used (environment, profile,
    instance role). ``path_style`` addresses buckets as ``endpoint/bucket`` (needed by MinIO,
    moto and most self-hosted servers). ``region`` signs requests (SigV4) for endpoints that
    check it. Files of ``part_size`` or more move in parts of that size, ``concurrency`` at once.
    """

    endpoint: str
    access_key: Credential | None = field(default=None, repr=False)
    secret_key: Credential | None = field(default=None, repr=False)
    path_style: bool = False
    region: str | None = None
    part_size: int = DEFAULT_PART_SIZE
    concurrency: int = DEFAULT_CONCURRENCY

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"Storage endpoint must be an http(s) URL, got {self.endpoint!r}")
        if (self.access_key is None) != (self.secret_key is None):
            raise ConfigError("Storage needs both access_key and secret_key, or neither (then "
                              "boto3's default credentials are used)")
        if self.part_size < 5 * MiB:
            raise ConfigError(f"part_size must be at least 5 MiB (S3's smallest part), got "
                              f"{self.part_size}")
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {self.concurrency}")

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """As a pydantic field (``Volume.storage``): checked by type only, never rebuilt, and
        dumped as its repr, which leaves the keys out."""
        from pydantic_core import core_schema

        def check(value: Any) -> StorageEndpoint:
            if not isinstance(value, StorageEndpoint):  # pydantic wants a ValueError
                raise ValueError(  # noqa: TRY004
                    "storage must be a sky.Storage(...) or a sky.storage preset such as "
                    f"sky.storage.S3(region=...), not {type(value).__name__}")
            return value

        return core_schema.no_info_plain_validator_function(
            check, serialization=core_schema.plain_serializer_function_ser_schema(
                repr, return_schema=core_schema.str_schema()))

    def keys(self) -> tuple[str, str] | None:
        """The resolved (access key, secret key), or None when the storage has none."""
        access = resolve_credential(self.access_key, "access_key")
        secret = resolve_credential(self.secret_key, "secret_key")
        return (access, secret) if access is not None and secret is not None else None
