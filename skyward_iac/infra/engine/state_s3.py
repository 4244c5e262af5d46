"""Read a Pulumi S3 backend's records straight from its objects: listings of a team's stacks
without one engine start per stack.

Through the engine, ``skyward-iac history`` over 20 runs on an S3 backend took 11.9 s (each
stack's tags, history and state one ``pulumi`` start apiece). The S3 backend is Pulumi's DIY
backend on a bucket, the same layout as the file backend (pulumi/pulumi v3.274.1,
pkg/backend/diy: ``store.go`` ``StacksDir``/``HistoriesDir`` and the project store's
``StackBasePath``/``HistoryDir``, ``stack_tags.go`` ``stackTagsPath``, ``state.go``
``addToHistory``, ``meta.go``):

* ``.pulumi/meta.yaml``: ``version: 1`` for the project layout read here;
* ``.pulumi/stacks/<project>/<stack>.json[.gz]``: the checkpoint (``.bak`` beside it);
* ``.pulumi/stacks/<project>/<stack>.pulumi-tags``: ``{"version": 1, "tags": {...}}``;
* ``.pulumi/history/<project>/<stack>/<stack>-<unix nanos>.history.json[.gz]``: one per
  update (a ``.checkpoint.json`` copy beside each);
* a path in the URL (``s3://bucket/team``) is a prefix of every key (``blob.PrefixedBucket``).

Only tags, update records and resource types are read: nothing is decrypted, the secrets
provider is never asked. Requests run in parallel, with boto3's default credential chain (the
engine's AWS SDK has the same: environment, shared files and profile, SSO, web identity,
instance role) and the URL's own settings (``region``, ``endpoint``, ``profile``, path style,
``disableSSL``). A URL with a setting not handled here (``role=``...), a compressed form not
readable here (``.zst``), another layout, or any request failing: ``read_stacks`` returns None
and callers ask the engine, which knows, and words an outage its own way.

Objects that did not change are not read twice: each summary is cached under the skyward home
by key and ETag (``state_cache.py``). A run's history is read again only while it may still
grow (the stack holds resources, or its last update is not a destroy that succeeded).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from skyward_iac.infra.engine.state_cache import StateCache
from skyward_iac.infra.engine.state_files import (
    StoredStack,
    StoredUpdate,
    newest_first,
    parse,
    resource_count,
    stored_update,
)

#: Whose update histories to read: every stack's, none, or those a function of the stacks read
#: without them picks (``history --limit``: the newest runs').
Updates = bool | Callable[[list[StoredStack]], Collection[str]]
#: Parallel requests: S3 serves many at once; the bound keeps sockets and threads modest.
WORKERS = 32
#: URL settings this reader applies like gocloud.dev's s3blob and Pulumi's legacy translation
#: (``translateLegacyS3Params``); any other setting sends the caller to the engine.
KNOWN = {"region", "endpoint", "profile", "s3ForcePathStyle", "use_path_style", "disableSSL",
         "disable_https", "awssdk", "request_checksum_calculation",
         "response_checksum_validation"}


@dataclass(frozen=True, slots=True)
class Location:
    """A bucket, the key prefix of the backend in it, and how to reach it."""

    bucket: str
    prefix: str
    region: str | None = None
    endpoint: str | None = None
    profile: str | None = None
    path_style: bool = False


def location(url: str) -> Location | None:
    """Where an ``s3://`` backend URL points; None for one this reader does not handle."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        return None
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    if set(query) - KNOWN:
        return None
    insecure = _true(query.get("disableSSL")) or _true(query.get("disable_https"))
    endpoint = query.get("endpoint")
    if endpoint and "://" not in endpoint:
        endpoint = f"{'http' if insecure else 'https'}://{endpoint}"
    prefix = parts.path.strip("/")
    return Location(bucket=parts.netloc, prefix=f"{prefix}/" if prefix else "",
                    region=query.get("region"), endpoint=endpoint,
                    profile=query.get("profile"),
                    path_style=_true(query.get("s3ForcePathStyle"))
                    or _true(query.get("use_path_style")))


def _true(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


class Unreadable(Exception):
    """The backend is not readable here (the caller asks the engine)."""


@dataclass
class _Stack:
    """What the listing says of one stack: its objects' keys and ETags."""

    name: str
    checkpoint: tuple[str, str] | None = None
    tags: tuple[str, str] | None = None
    count: int = 0
    stored_tags: dict[str, str] = field(default_factory=dict)
    updates: tuple[StoredUpdate, ...] = ()


class Reader:
    """One look at a backend: listings and reads through one client, summaries cached."""

    def __init__(self, where: Location, cache: StateCache, client: Any = None) -> None:
        self.where = where
        self.cache = cache
        self.client = client or _client(where)
        self.names: set[str] = set()
        self.project = ""

    def key(self, path: str) -> str:
        return self.where.prefix + path

    def get(self, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.where.bucket, Key=key)["Body"].read())

    def listing(self, prefix: str) -> dict[str, str]:
        """Every key under ``prefix`` with its ETag."""
        found: dict[str, str] = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.where.bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents") or []:
                found[item["Key"]] = item.get("ETag", "")
        return found

    def summary(self, key: str, etag: str, read: Callable[[bytes], Any]) -> Any:
        """``read`` of the object's content, from the cache when its ETag did not change."""
        cached = self.cache.get(key, etag)
        if cached is not None:
            return cached
        value = read(self.get(key))
        self.cache.put(key, etag, value)
        return value

    def read_stacks(self, project: str, updates: Updates) -> list[StoredStack]:
        self._check_layout()
        base = self.key(f".pulumi/stacks/{project}/")
        stacks: dict[str, _Stack] = {}
        for key, etag in self.listing(base).items():
            name = key.removeprefix(base)
            if "/" in name:
                continue  # not a stack of this project's directory
            if name.endswith((".json.zst", ".json.zst.bak")):
                raise Unreadable(f"{key}: zstd-compressed state is read by the engine only")
            for suffix, slot in ((".json", "checkpoint"), (".json.gz", "checkpoint"),
                                 (".pulumi-tags", "tags")):
                if name.endswith(suffix):
                    stack = stacks.setdefault(name.removesuffix(suffix), _Stack(
                        name.removesuffix(suffix)))
                    setattr(stack, slot, (key, etag))
        found = sorted((s for s in stacks.values() if s.checkpoint is not None),
                       key=lambda s: s.name)
        self.names, self.project = {stack.name for stack in found}, project
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(self._read, found))
            wanted = (set(updates(self._stored(found))) if callable(updates)
                      else self.names if updates else set())
            list(pool.map(self._read_updates, [s for s in found if s.name in wanted]))
        return self._stored(found)

    @staticmethod
    def _stored(found: list[_Stack]) -> list[StoredStack]:
        return [StoredStack(s.name, s.stored_tags, s.count, s.updates) for s in found]

    def of_a_stack(self, key: str) -> bool:
        """Whether ``key`` (an object or a history directory) belongs to a stack the last
        ``read_stacks`` listed: what the cache keeps."""
        for base, ends in ((self.key(f".pulumi/stacks/{self.project}/"), "."),
                           (self._history_prefix(self.project), "/")):
            if key.startswith(base):
                rest = key.removeprefix(base)
                return any(rest.startswith(name + ends) for name in _candidates(rest, ends)
                           if name in self.names)
        return False

    def _check_layout(self) -> None:
        try:
            meta = self.get(self.key(".pulumi/meta.yaml")).decode()
        except Exception as exc:  # noqa: BLE001 - any failure: the engine knows better
            raise Unreadable(f"no readable .pulumi/meta.yaml ({exc})") from None
        if "version: 1" not in meta.splitlines():
            raise Unreadable(f"layout {meta.strip()!r} is not the project layout (version 1)")

    def _history_prefix(self, project: str) -> str:
        return self.key(f".pulumi/history/{project}/")

    def _read(self, stack: _Stack) -> None:
        assert stack.checkpoint is not None
        stack.count = self.summary(*stack.checkpoint, lambda data: resource_count(parse(data)))
        if stack.tags is not None:
            stack.stored_tags = self.summary(*stack.tags,
                                             lambda data: dict(parse(data).get("tags") or {}))

    def _read_updates(self, stack: _Stack) -> None:
        """The stack's update history, newest first; listed again only while it may grow."""
        assert stack.checkpoint is not None
        prefix = self._history_prefix(self.project) + stack.name + "/"
        keys = self.cache.settled(prefix, stack.checkpoint[1])
        if keys is None:
            keys = {key: etag for key, etag in self.listing(prefix).items()
                    if key.endswith((".history.json", ".history.json.gz"))}
        history = newest_first([
            _from_record(self.summary(key, etag, lambda data: _update_record(parse(data))))
            for key, etag in keys.items()])
        last = history[0] if history else None
        if stack.count == 0 and last is not None and last.kind == "destroy" \
                and last.result == "succeeded":
            self.cache.settle(prefix, stack.checkpoint[1], keys)  # it will not grow any more
        stack.updates = history


def _candidates(rest: str, ends: str) -> list[str]:
    """The stack names ``rest`` (a key below a project's directory) may start with: each
    prefix up to an ``ends`` character (stack names may hold dots)."""
    return [rest[:index] for index, char in enumerate(rest) if char == ends]


def _update_record(info: Any) -> dict[str, Any]:
    """The cached form of a history record (what ``StoredUpdate`` keeps, as plain JSON)."""
    update = stored_update(info)
    return {"kind": update.kind, "result": update.result, "message": update.message,
            "start": update.start_time.timestamp(),
            "end": update.end_time.timestamp() if update.end_time else None}


def _from_record(record: Mapping[str, Any]) -> StoredUpdate:
    return stored_update({"kind": record["kind"], "result": record["result"],
                          "message": record["message"], "startTime": record["start"],
                          "endTime": record["end"]})


_clients: dict[Location, Any] = {}
_clients_lock = threading.Lock()


def _client(where: Location) -> Any:
    """One boto3 S3 client per location and process (clients are thread-safe)."""
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    with _clients_lock:
        if where not in _clients:
            session = boto3.session.Session(profile_name=where.profile)
            config = Config(max_pool_connections=WORKERS, retries={"max_attempts": 3},
                            connect_timeout=10, read_timeout=30,
                            s3={"addressing_style": "path" if where.path_style else "auto"})
            _clients[where] = session.client("s3", region_name=where.region,
                                             endpoint_url=where.endpoint, config=config)
        return _clients[where]


def read_stacks(url: str, project: str, cache_file: Path | None,
                updates: Updates = False) -> list[StoredStack] | None:
    """Every stack of ``project`` in the S3 backend at ``url`` with its raw tags and resource
    count (and its update history, newest first, with ``updates``: of every stack, or of
    those ``updates`` picks from the stacks read without); None when the backend
    cannot be read here (then ask the engine)."""
    where = location(url)
    if where is None:
        return None
    cache = StateCache(cache_file)
    try:
        reader = Reader(where, cache)
        stacks = reader.read_stacks(project, updates)
    except Exception:  # noqa: BLE001 - an outage, no credentials, a layout not known here:
        return None  # the engine reads it, or says why it cannot in its own words
    try:
        cache.save(reader.of_a_stack)
    except OSError:
        pass  # a cache that cannot be written costs the next look its reads, nothing more
    return stacks
