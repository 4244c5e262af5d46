"""What a look at a remote backend learned, kept for the next look: each object's summary by
key and ETag (an object rewritten gets a new ETag, so a stale summary is never used), and the
history keys of runs whose history cannot grow any more.

It also keeps where the last listing of a prefix could be cut into pages listed in parallel
(every thousandth key). One JSON file per backend under the skyward home (0600; tags, update
messages and counts only: nothing secret). Two processes saving at once each write a whole file
(atomic rename); the loser's summaries are read again next time. A missing or unreadable file is
an empty cache.

The same summaries are shared with the team as one gzip'd object in the backend (``shared`` and
``absorb``; ``state_s3.py`` reads and writes it): a machine's first look takes them from there
instead of reading every object again. They are used under the same rule, only for an object
whose ETag in the listing is the one they were read at.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

VERSION = 1
#: The most a shared cache may expand to (a corrupt or hostile object is ignored, not loaded):
#: about 1 KB a run, so room for a few hundred thousand runs.
MAX_SHARED = 512 * 1024 * 1024


class StateCache:
    """Summaries by key and ETag; ``path`` None keeps them for this process only."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._objects: dict[str, list[Any]] = {}
        self._settled: dict[str, list[Any]] = {}
        self._splits: dict[str, list[str]] = {}
        self._changed = False
        #: (key, ETag) of the summaries the team's shared cache held when absorbed.
        self._shared: set[tuple[str, str]] = set()
        if path is not None:
            try:
                data = json.loads(path.read_text())
                if data.get("version") == VERSION:
                    self._objects, self._settled = data["objects"], data["settled"]
                    self._splits = data.get("splits") or {}
            except (OSError, ValueError, KeyError, AttributeError):
                pass  # no cache yet, or one of another version: start afresh

    def get(self, key: str, etag: str) -> Any | None:
        """The summary of ``key`` at ``etag``, None when not cached (or it changed since)."""
        with self._lock:
            entry = self._objects.get(key)
        return entry[1] if entry is not None and etag and entry[0] == etag else None

    def put(self, key: str, etag: str, value: Any) -> None:
        with self._lock:
            self._objects[key] = [etag, value]
            self._changed = True

    def settled(self, prefix: str, checkpoint_etag: str) -> dict[str, str] | None:
        """The history keys (and ETags) under ``prefix`` recorded as final while the stack's
        checkpoint was ``checkpoint_etag``; None if not (or the checkpoint changed since)."""
        with self._lock:
            entry = self._settled.get(prefix)
        return dict(entry[1]) if entry is not None and entry[0] == checkpoint_etag else None

    def settle(self, prefix: str, checkpoint_etag: str, keys: dict[str, str]) -> None:
        with self._lock:
            if self._settled.get(prefix) != [checkpoint_etag, keys]:
                self._settled[prefix] = [checkpoint_etag, dict(keys)]
                self._changed = True

    def splits(self, prefix: str) -> list[str]:
        """Keys that cut the last listing of ``prefix`` into pages (none before one)."""
        with self._lock:
            return list(self._splits.get(prefix, []))

    def set_splits(self, prefix: str, keys: list[str]) -> None:
        with self._lock:
            if self._splits.get(prefix) != keys:
                self._splits[prefix] = list(keys)
                self._changed = True

    def absorb(self, data: bytes) -> None:
        """Take the summaries of a shared cache (``shared``'s bytes) that this one lacks; a
        cache of another version, or not one at all, is ignored."""
        try:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            text = inflater.decompress(data, MAX_SHARED)
            if inflater.unconsumed_tail:
                return  # larger than any real one: not loaded
            shared = json.loads(text)
            if shared.get("version") != VERSION:
                return
            objects, settled = dict(shared["objects"]), dict(shared["settled"])
        except (ValueError, KeyError, AttributeError, TypeError, zlib.error):
            return
        with self._lock:
            for key, entry in objects.items():
                if isinstance(entry, list) and len(entry) == 2:
                    self._shared.add((key, entry[0]))
                    if key not in self._objects:
                        self._objects[key] = entry
                        self._changed = True
            for prefix, entry in settled.items():
                if prefix not in self._settled and isinstance(entry, list) and len(entry) == 2:
                    self._settled[prefix] = entry
                    self._changed = True

    def unshared(self, keep: Callable[[str], bool]) -> int:
        """How many summaries ``keep`` keeps that the absorbed shared cache did not have."""
        with self._lock:
            return sum(1 for key, entry in self._objects.items()
                       if keep(key) and (key, entry[0]) not in self._shared)

    def shared(self, keep: Callable[[str], bool]) -> bytes:
        """The summaries ``keep`` keeps, as the team's shared cache (gzip'd JSON)."""
        objects, settled = self._kept(keep)
        return gzip.compress(json.dumps({"version": VERSION, "objects": objects,
                                         "settled": settled},
                                        separators=(",", ":")).encode(), 6)

    def _kept(self, keep: Callable[[str], bool]) -> tuple[dict[str, Any], dict[str, Any]]:
        with self._lock:
            return ({k: v for k, v in self._objects.items() if keep(k)},
                    {k: v for k, v in self._settled.items() if keep(k)})

    def save(self, keep: Callable[[str], bool]) -> None:
        """Write the cache, without the entries ``keep`` rejects (removed stacks)."""
        if self.path is None:
            return
        objects, settled = self._kept(keep)
        with self._lock:
            if not self._changed and len(objects) == len(self._objects) \
                    and len(settled) == len(self._settled):
                return
            text = json.dumps({"version": VERSION, "objects": objects, "settled": settled,
                               "splits": self._splits}, separators=(",", ":"))
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(text)
        tmp.replace(self.path)
