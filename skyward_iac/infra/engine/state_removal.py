"""Remove an empty stack straight from a Pulumi DIY backend (file or S3): what
``pulumi stack rm --yes --remove-backups`` deletes, without an engine start.

gc's prune went through the engine, two starts a stack (``stack select``, ``stack rm``): 10
stacks took 32.7 s on moto's S3, 1,000 would take about 55 minutes. The DIY backend's removal is
a handful of object operations on the layout the readers already know (``state_files.py``,
``state_s3.py``). What the engine does, pulumi/pulumi v3.274.1 (pkg/, the module the built
engine is made from):

* ``cmd/pulumi/stack/stack_remove.go:94-115``: ``backend.RemoveStack``, then the stack's
  settings file ``Pulumi.<stack>.yaml`` in the project directory is deleted (left to the caller
  here: the engine package does not know the skyward workspace);
* ``backend/diy/backend.go:1078-1103`` ``RemoveStack``: takes the stack's lock, reads the
  checkpoint, refuses a stack with resources (but a lone root ``pulumi:pulumi:Stack``);
* ``backend/diy/state.go:409-446`` ``removeStack`` with ``removeBackups``: deletes the
  checkpoint and its ``.bak`` (``removeTargetAndBackup``, ``state.go:449-462``), every object
  of ``.pulumi/backups/<project>/<stack>/``, the tags ``<stack>.pulumi-tags``
  (``stack_tags.go:38-41,127-140``) and every object of ``.pulumi/history/<project>/<stack>/``
  (``removeAllByPrefix``, ``bucket.go:171-185``);
* ``backend/diy/lock.go:63-178``: a lock is ``.pulumi/locks/organization/<project>/<stack>/
  <uuid>.json`` holding ``{"pid", "username", "hostname", "timestamp"}``; ``Lock`` writes its
  own, then fails if any other is listed there.

Here: a stack with any lock file is left alone (the engine may be at work on it: ``BUSY``).
Otherwise our own lock is written, the directory listed again (another lock: ours is removed,
``BUSY``), the checkpoint read again and the stack removed only if it holds no resource and no
pending operation (else ``NOT_EMPTY``). The checkpoint is deleted last, not first as the engine
does: a removal that fails half way leaves a stack the engine's ``stack rm`` still finds.
Anything not known here (another ``meta.yaml`` layout, a ``.json.zst`` checkpoint, both a
``.json`` and a ``.json.gz``, a request failing) is ``UNKNOWN``: the caller asks the engine.
On the file backend gocloud's fileblob keeps a ``<file>.attrs`` beside each file; it goes with
its file, as fileblob's own ``Delete`` does.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from skyward_iac.infra.engine.state_cache import StateCache
from skyward_iac.infra.engine.state_files import parse
from skyward_iac.infra.engine.state_s3 import WORKERS, Reader, location

REMOVED, BUSY, NOT_EMPTY, UNKNOWN = "removed", "busy", "not-empty", "unknown"
#: The engine's root resource: a checkpoint holding only it is empty (``RemoveStack``).
ROOT_STACK = "pulumi:pulumi:Stack"
#: fileblob's attributes file beside each file of the file backend.
ATTRS = ".attrs"


class Store(Protocol):
    """A backend's objects by key (relative to its root)."""

    def keys(self, prefix: str) -> list[str]: ...
    def get(self, key: str) -> bytes: ...
    def put(self, key: str, body: bytes) -> None: ...
    def delete(self, keys: list[str]) -> None: ...


class FileStore:
    """The file backend at ``root``: keys are paths under it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def keys(self, prefix: str) -> list[str]:
        directory, _, start = prefix.rpartition("/")
        base = self.root / directory
        if not base.is_dir():
            return []
        # One directory, as the engine lists (``listBucket``: delimiter "/"): flat here.
        return sorted(f"{directory}/{entry.name}" for entry in os.scandir(base)
                      if entry.is_file() and entry.name.startswith(start)
                      and not entry.name.endswith(ATTRS))

    def get(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def put(self, key: str, body: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            for path in (self.root / key, self.root / (key + ATTRS)):
                path.unlink(missing_ok=True)


class S3Store:
    """The S3 backend read by ``state_s3.Reader``: keys under its prefix."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    def keys(self, prefix: str) -> list[str]:
        cut = len(self.reader.where.prefix)
        return sorted(key[cut:] for key in self.reader.listing(self.reader.key(prefix)))

    def get(self, key: str) -> bytes:
        return self.reader.get(self.reader.key(key))

    def put(self, key: str, body: bytes) -> None:
        self.reader.client.put_object(Bucket=self.reader.where.bucket,
                                      Key=self.reader.key(key), Body=body)

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # DeleteObjects takes 1,000 keys at most
            batch = [{"Key": self.reader.key(key)} for key in keys[start:start + 1000]]
            answer = self.reader.client.delete_objects(
                Bucket=self.reader.where.bucket, Delete={"Objects": batch, "Quiet": True})
            if answer.get("Errors"):
                raise OSError(f"S3 refused to delete {answer['Errors'][0]}")


def store_for(url: str) -> Store | None:
    """The store of the backend at ``url`` (``file://`` or ``s3://``), or None: the engine's."""
    if url.startswith("file://"):
        if "?" in url:  # fileblob options (no_tmp_dir...): not handled here
            return None
        return FileStore(Path(url.removeprefix("file://")))
    where = location(url)
    return S3Store(Reader(where, StateCache(None))) if where is not None else None


def is_empty(checkpoint: Any) -> bool:
    """Whether a checkpoint holds no resource (a lone root stack aside, as ``RemoveStack``
    allows) and no pending operation (what a crashed update leaves: gc's destroy clears it)."""
    latest = (checkpoint.get("checkpoint") or {}).get("latest") or {}
    resources = latest.get("resources") or []
    if latest.get("pending_operations"):
        return False
    return not resources or (len(resources) == 1 and resources[0].get("type") == ROOT_STACK)


def lock_dir(project: str, stack: str) -> str:
    return f".pulumi/locks/organization/{project}/{stack}/"


def _lock_body() -> bytes:
    return json.dumps({"pid": os.getpid(), "username": getpass.getuser(),
                       "hostname": socket.gethostname(),
                       "timestamp": datetime.now(UTC).isoformat()}).encode()


def _checkpoint(store: Store, project: str, stack: str) -> str | None:
    """The key of the stack's checkpoint; None when its form is not one handled here."""
    base = f".pulumi/stacks/{project}/{stack}.json"
    found = [key for key in store.keys(base) if key in (base, base + ".gz", base + ".zst")]
    return found[0] if found in ([base], [base + ".gz"]) else None


def remove_empty(store: Store, project: str, stack: str) -> str:
    """Remove ``stack`` of ``project`` if it is unlocked and empty: ``REMOVED``, ``BUSY``,
    ``NOT_EMPTY`` or ``UNKNOWN`` (a form not handled here, or a request failed)."""
    locks = lock_dir(project, stack)
    ours = f"{locks}{uuid.uuid4()}.json"
    try:
        if store.keys(locks):
            return BUSY
        store.put(ours, _lock_body())
    except Exception:  # noqa: BLE001 - an outage or a refusal: the engine says it its way
        return UNKNOWN
    try:
        if [key for key in store.keys(locks) if key != ours]:
            return BUSY  # another writer took the lock at the same time: it goes first
        checkpoint = _checkpoint(store, project, stack)
        if checkpoint is None:
            return UNKNOWN
        if not is_empty(parse(store.get(checkpoint))):
            return NOT_EMPTY
        doomed = [*store.keys(f".pulumi/backups/{project}/{stack}/"),
                  *store.keys(f".pulumi/history/{project}/{stack}/"),
                  f".pulumi/stacks/{project}/{stack}.pulumi-tags", checkpoint + ".bak"]
        store.delete(doomed)
        store.delete([checkpoint])  # last: a failure above leaves a stack `stack rm` finds
        return REMOVED
    except Exception:  # noqa: BLE001 - the engine knows better
        return UNKNOWN
    finally:
        with contextlib.suppress(Exception):  # a lock left behind: `pulumi cancel` clears it
            store.delete([ours])


def remove_empty_stacks(url: str, project: str, stacks: Iterable[str]) -> dict[str, str]:
    """``remove_empty`` of each of ``stacks`` (in parallel) in the backend at ``url``; every
    one ``UNKNOWN`` when the backend is not one handled here or its layout is not known."""
    names = list(stacks)
    store = store_for(url) if names else None
    try:
        known = store is not None and "version: 1" in store.get(".pulumi/meta.yaml").decode() \
            .splitlines()
    except Exception:  # noqa: BLE001 - unreadable: the engine's turn
        known = False
    if store is None or not known:
        return dict.fromkeys(names, UNKNOWN)
    with ThreadPoolExecutor(min(WORKERS, len(names))) as pool:
        return dict(zip(names, pool.map(lambda name: remove_empty(store, project, name), names),
                        strict=True))
