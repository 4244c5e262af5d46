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
provider is never asked. Requests run in parallel, with botocore's default credential chain (the
engine's AWS SDK has the same: environment, shared files and profile, SSO, web identity,
instance role) and the URL's own settings (``region``, ``endpoint``, ``profile``, path style,
``disableSSL``). A URL with a setting not handled here (``role=``...), a compressed form not
readable here (``.zst``), another layout, or any request failing: ``read_stacks`` returns None
and callers ask the engine, which knows, and words an outage its own way.

Objects that did not change are not read twice: each summary is cached under the skyward home
by key and ETag (``state_cache.py``). A run's history is read again only while it may still
grow (the stack holds resources, or its last update is not a destroy that succeeded).

A machine's first look would read every run's objects (about five requests a run: 55 s for
1,000 runs on moto's S3, most of it the server's CPU per request), so the summaries are shared
with the team in the backend, ``.skyward/listings/<project>.json.gz`` (``SHARED``): a look that
misses more than ``SHARE`` summaries reads it first (one request), and one that then read more
than ``SHARE`` objects itself writes what it knows back (a refused write costs nothing but the
next machine's reads). Anyone who can write the bucket can already rewrite the records
themselves: the shared summaries are used only for an object whose listed ETag they were read
at, like the local ones. A stack whose newest update is a destroy that succeeded, and whose
checkpoint has the ETag of that update's checkpoint copy, is empty: its checkpoint is not read.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from skyward_iac.infra.engine.state_cache import StateCache
from skyward_iac.infra.engine.state_files import (
    COPIES,
    RECORDS,
    StoredStack,
    StoredUpdate,
    Updates,
    copy_of,
    emptied,
    from_record,
    parse,
    resource_count,
    update_record,
)

#: Parallel requests: S3 serves many at once; the bound keeps sockets and threads modest.
WORKERS = 32
#: Keys per page of a listing (S3's most).
PAGE = 1000
#: More histories than this to list: one listing of every history instead of one each.
SWEEP = 20
#: A look missing more summaries than this reads the team's shared ones first; one that read
#: more objects than this itself shares what it knows.
SHARE = 20
#: The team's shared summaries of a project's stacks, under the backend's root.
SHARED = ".skyward/listings/{project}.json.gz"
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
        self.project = ""
        #: Whether this look read the team's shared summaries (or found none to read).
        self.shared_read = False
        #: The keys (and history directories) of the stacks the last look found.
        self.kept: set[str] = set()

    def key(self, path: str) -> str:
        return self.where.prefix + path

    def get(self, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.where.bucket, Key=key)["Body"].read())

    def listing(self, prefix: str, after: str = "", until: str | None = None) -> dict[str, str]:
        """Every key under ``prefix`` (after ``after``, up to ``until``) with its ETag."""
        found: dict[str, str] = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.where.bucket, Prefix=prefix, StartAfter=after)
        for page in pages:
            for item in page.get("Contents") or []:
                if until is not None and item["Key"] > until:
                    return found  # the next range's: listed by its own request
                found[item["Key"]] = item.get("ETag", "")
                if item["Key"] == until:
                    return found  # no request for the page after it
        return found

    def listing_in_parallel(self, pool: ThreadPoolExecutor, prefix: str) -> dict[str, str]:
        """``listing(prefix)``, its pages requested at once: cut where the last listing's
        pages began (a page is at most 1,000 keys, one request after the other otherwise)."""
        cuts = self.cache.splits(prefix)
        ranges = list(zip(["", *cuts], [*cuts, None], strict=True))
        found: dict[str, str] = {}
        for part in pool.map(lambda bounds: self.listing(prefix, *bounds), ranges):
            found.update(part)
        ordered = sorted(found)
        self.cache.set_splits(prefix, ordered[PAGE - 1:-1:PAGE])
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
        self.project = project
        base = self.key(f".pulumi/stacks/{project}/")
        with ThreadPoolExecutor(WORKERS) as pool:
            listed = self.listing_in_parallel(pool, base)
        stacks: dict[str, _Stack] = {}
        for key, etag in listed.items():
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
        # What the cache keeps: these stacks' objects and history directories.
        self.kept = set(listed) | {self._history_of(s) for s in found}
        if sum(1 for s in found if not self._cached(s)) > SHARE:
            self._absorb_shared()
        missing = [s for s in found if not self._cached(s)]
        with ThreadPoolExecutor(WORKERS) as pool:
            # Tags first: histories are picked by them, and a history may say a stack is
            # empty (then its checkpoint is not read).
            list(pool.map(self._read_tags, missing))
            names = {stack.name for stack in found}
            wanted = (set(updates(self._stored(found))) if callable(updates)
                      else names if updates else set())
            chosen = [s for s in found if s.name in wanted]
            keys = self._history_keys(pool, chosen)
            empty = set(pool.map(lambda s: self._read_updates(s, keys[self._history_of(s)]),
                                 chosen)) - {None}
            list(pool.map(self._read_count, [s for s in missing if s.name not in empty]))
        for stack in chosen:
            self._settle(stack, keys[self._history_of(stack)])
        return self._stored(found)

    def _absorb_shared(self) -> None:
        """Take the team's shared summaries (none yet, or unreadable: read the objects)."""
        self.shared_read = True
        with contextlib.suppress(Exception):  # a cache, not a record: a failure costs reads
            self.cache.absorb(self.get(self.key(SHARED.format(project=self.project))))

    def share(self) -> None:
        """Write back the summaries this look read beyond the team's shared ones, when it
        read the shared ones and more than ``SHARE`` objects besides."""
        if self.shared_read and self.cache.unshared(self.of_a_stack) > SHARE:
            self.client.put_object(Bucket=self.where.bucket,
                                   Key=self.key(SHARED.format(project=self.project)),
                                   Body=self.cache.shared(self.of_a_stack))

    @staticmethod
    def _stored(found: list[_Stack]) -> list[StoredStack]:
        return [StoredStack(s.name, s.stored_tags, s.count, s.updates) for s in found]

    def of_a_stack(self, key: str) -> bool:
        """Whether ``key`` (an object, a history directory or a record in it) belongs to a
        stack the last ``read_stacks`` listed: what the cache keeps."""
        return key in self.kept or key.rsplit("/", 1)[0] + "/" in self.kept

    def _check_layout(self) -> None:
        try:
            meta = self.get(self.key(".pulumi/meta.yaml")).decode()
        except Exception as exc:  # noqa: BLE001 - any failure: the engine knows better
            raise Unreadable(f"no readable .pulumi/meta.yaml ({exc})") from None
        if "version: 1" not in meta.splitlines():
            raise Unreadable(f"layout {meta.strip()!r} is not the project layout (version 1)")

    def _history_prefix(self, project: str) -> str:
        return self.key(f".pulumi/history/{project}/")

    def _history_of(self, stack: _Stack) -> str:
        return self._history_prefix(self.project) + stack.name + "/"

    def _cached(self, stack: _Stack) -> bool:
        """Fill in ``stack`` from the cache alone; False when something must be read."""
        assert stack.checkpoint is not None
        count = self.cache.get(*stack.checkpoint)
        tags = self.cache.get(*stack.tags) if stack.tags is not None else {}
        if count is None or tags is None:
            return False
        stack.count, stack.stored_tags = count, tags
        return True

    def _read_count(self, stack: _Stack) -> None:
        assert stack.checkpoint is not None
        stack.count = self.summary(*stack.checkpoint, lambda data: resource_count(parse(data)))

    def _read_tags(self, stack: _Stack) -> None:
        if stack.tags is not None:
            stack.stored_tags = self.summary(*stack.tags,
                                             lambda data: dict(parse(data).get("tags") or {}))

    def _history_keys(self, pool: ThreadPoolExecutor,
                      stacks: list[_Stack]) -> dict[str, dict[str, str]]:
        """The history records of each of ``stacks`` (by its history directory), with their
        ETags: as the cache has them for a history that cannot grow, else listed; listed in
        one sweep of every history when many are (one listing per stack costs more)."""
        found: dict[str, dict[str, str]] = {}
        unsettled = []
        for stack in stacks:
            assert stack.checkpoint is not None
            settled = self.cache.settled(self._history_of(stack), stack.checkpoint[1])
            if settled is None:
                unsettled.append(self._history_of(stack))
            else:
                found[self._history_of(stack)] = settled
        if len(unsettled) > SWEEP:
            every = self.listing_in_parallel(pool, self._history_prefix(self.project))
            listings = _grouped(every, unsettled)
        else:
            listings = list(pool.map(self.listing, unsettled))
        for prefix, listing in zip(unsettled, listings, strict=True):
            found[prefix] = {key: etag for key, etag in listing.items()
                             if key.endswith(RECORDS + COPIES)}
        return found

    def _read_updates(self, stack: _Stack, keys: dict[str, str]) -> str | None:
        """The stack's update history, newest first; its name when that history shows it
        empty (``emptied``), its count then known without reading its checkpoint."""
        records = sorted(((self.summary(key, etag, lambda data: update_record(parse(data))),
                           key) for key, etag in keys.items() if key.endswith(RECORDS)),
                         key=lambda pair: pair[0]["start"], reverse=True)
        stack.updates = tuple(from_record(record) for record, _ in records)
        assert stack.checkpoint is not None
        if not records or not emptied(records[0][0], stack.checkpoint[1],
                                      keys.get(copy_of(records[0][1]))):
            return None
        if self.cache.get(*stack.checkpoint) is None:
            self.cache.put(*stack.checkpoint, 0)
        stack.count = 0
        return stack.name

    def _settle(self, stack: _Stack, keys: dict[str, str]) -> None:
        """Record the stack's history as final once it cannot grow (empty, and its newest
        update a destroy that succeeded)."""
        assert stack.checkpoint is not None
        last = stack.updates[0] if stack.updates else None
        if stack.count == 0 and last is not None and last.kind == "destroy" \
                and last.result == "succeeded":
            self.cache.settle(self._history_of(stack), stack.checkpoint[1],
                              {key: etag for key, etag in keys.items()
                               if key.endswith(RECORDS)})


def _grouped(keys: Mapping[str, str], prefixes: list[str]) -> list[dict[str, str]]:
    """``keys`` split by the directory they are in, in the order of ``prefixes``."""
    by_directory: dict[str, dict[str, str]] = {}
    for key, etag in keys.items():
        by_directory.setdefault(key.rsplit("/", 1)[0] + "/", {})[key] = etag
    return [by_directory.get(prefix, {}) for prefix in prefixes]


_clients: dict[Location, Any] = {}
_clients_lock = threading.Lock()


def _client(where: Location) -> Any:
    """One S3 client per location and process (clients are thread-safe). Listing timestamps
    stay text: nothing here reads them, and parsing them was a third of a warm listing's CPU
    (botocore's documented ``response_parser_factory`` default, as the AWS CLI sets it)."""
    import botocore.session  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    with _clients_lock:
        if where not in _clients:
            session = botocore.session.Session(profile=where.profile)
            session.get_component("response_parser_factory").set_parser_defaults(
                timestamp_parser=str)
            config = Config(max_pool_connections=WORKERS, retries={"max_attempts": 3},
                            connect_timeout=10, read_timeout=30,
                            s3={"addressing_style": "path" if where.path_style else "auto"})
            _clients[where] = session.create_client("s3", region_name=where.region,
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
    with contextlib.suppress(Exception):  # refused or failed: the next machine reads the objects
        reader.share()
    return stacks
