"""Read the Pulumi file backend's records straight from disk, for listings of many stacks.

``pulumi stack ls``, ``stack tag ls`` and ``stack history`` cost an engine start each (about a
second apiece here), so ``skyward-iac history`` over 20 runs took ~30 s through the CLI. The
file backend keeps all of it as plain JSON: ``.pulumi/stacks/<project>/<stack>.json`` (the
checkpoint), ``<stack>.pulumi-tags`` and ``.pulumi/history/<project>/<stack>/*.history.json``.
Only reads, never writes; when the layout is not the one known here (another backend version,
a non-project layout) ``read_stacks`` returns None and callers go through the CLI instead.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class StoredUpdate:
    """One entry of a stack's update history (what ``pulumi stack history`` lists)."""

    kind: str
    result: str
    message: str
    start_time: datetime
    end_time: datetime | None


@dataclass(frozen=True, slots=True)
class StoredStack:
    """One stack as the file backend keeps it: raw tags, resource count, updates newest first."""

    name: str
    tags: dict[str, str]
    resource_count: int
    updates: tuple[StoredUpdate, ...]


#: Whose update histories a reader reads: every stack's, none, or those a function of the
#: stacks (read without them) picks (``history --limit``: the newest runs') by their names and
#: tags (the S3 reader may not have read their resource counts yet: a history can tell them).
Updates = bool | Callable[[list[StoredStack]], Collection[str]]

#: The magic bytes of a gzip stream: the engine writes ``.json.gz`` objects with
#: ``PULUMI_DIY_BACKEND_GZIP`` (``encoding.DetectCompression`` looks at the same bytes).
GZIP_MAGIC = b"\x1f\x8b"


def parse(data: bytes) -> Any:
    """One JSON record of the backend, gzip-compressed or not."""
    return json.loads(gzip.decompress(data) if data[:2] == GZIP_MAGIC else data)


def _load(path: Path) -> Any:
    return parse(path.read_bytes())


def _stamp(seconds: Any) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if isinstance(seconds, int | float) and seconds else None


def stored_update(info: Any) -> StoredUpdate:
    """A history record (``backend.UpdateInfo``) as a ``StoredUpdate``: its config, which may
    hold encrypted values, is not kept."""
    started = _stamp(info.get("startTime")) or datetime.fromtimestamp(0, UTC)
    return StoredUpdate(kind=info.get("kind", ""), result=info.get("result", ""),
                        message=info.get("message", ""), start_time=started,
                        end_time=_stamp(info.get("endTime")))


def newest_first(updates: list[StoredUpdate]) -> tuple[StoredUpdate, ...]:
    return tuple(sorted(updates, key=lambda u: u.start_time, reverse=True))


#: A history record's key ends so; its checkpoint copy's (``addToHistory``) the same with
#: ``checkpoint`` for ``history``.
RECORDS = (".history.json", ".history.json.gz")
COPIES = (".checkpoint.json", ".checkpoint.json.gz")


def copy_of(record: str) -> str:
    """The key of the checkpoint copy written beside the history record ``record``."""
    head, _, tail = record.rpartition(".history.json")
    return f"{head}.checkpoint.json{tail}"


#: Flags of an update that leave resources behind it (``pulumi destroy --target``,
#: ``--exclude``, ``--exclude-protected``): the engine records each flag set in the update's
#: ``environment`` as ``pulumi.flag.<name>``.
PARTIAL_FLAGS = ("pulumi.flag.target", "pulumi.flag.exclude")


def emptied(newest: Mapping[str, Any], checkpoint_etag: str, copy_etag: str | None) -> bool:
    """Whether a stack holds no resource, known from its history alone: its newest update
    (``update_record``'s form) is a destroy of the whole stack that succeeded, and its
    checkpoint is byte for byte that update's copy (the same ETag, an MD5 of the bytes: nothing
    was written since). Any doubt, or a record cached before ``whole`` was kept, reads the
    checkpoint."""
    return newest.get("kind") == "destroy" and newest.get("result") == "succeeded" \
        and newest.get("whole") is True and bool(copy_etag) and copy_etag == checkpoint_etag


def update_record(info: Any) -> dict[str, Any]:
    """The cached form of a history record (what ``StoredUpdate`` keeps, as plain JSON, and
    ``whole``: whether it changed only by deleting, with no flag that spares resources)."""
    update = stored_update(info)
    flags = [key for key in info.get("environment") or {} if key.startswith(PARTIAL_FLAGS)]
    changes = {kind for kind, count in (info.get("resourceChanges") or {}).items() if count}
    return {"kind": update.kind, "result": update.result, "message": update.message,
            "start": update.start_time.timestamp(),
            "end": update.end_time.timestamp() if update.end_time else None,
            "whole": not flags and changes <= {"delete"}}


def from_record(record: Mapping[str, Any]) -> StoredUpdate:
    """A ``StoredUpdate`` from its cached form (``update_record``)."""
    return stored_update({"kind": record["kind"], "result": record["result"],
                          "message": record["message"], "startTime": record["start"],
                          "endTime": record["end"]})


def resource_count(checkpoint: Any) -> int:
    """The resources of a stack's checkpoint, counted as ``ClusterStack.resource_count`` counts
    them: the stack itself and providers left out."""
    latest = (checkpoint.get("checkpoint") or {}).get("latest") or {}
    return sum(1 for r in latest.get("resources") or []
               if not str(r.get("type", "")).startswith("pulumi:"))


def _updates(directory: Path) -> tuple[StoredUpdate, ...]:
    return newest_first([stored_update(_load(path))
                         for path in directory.glob("*.history.json*")])


def read_stacks(state_dir: Path, project: str,
                updates: Updates = True) -> list[StoredStack] | None:
    """Every stack of ``project`` in the file backend at ``state_dir``, with the update
    histories ``updates`` asks for (all, none, or those a function of the stacks picks); None
    when the backend's layout is not the known one (then ask the CLI)."""
    root = state_dir / ".pulumi"
    stacks_dir = root / "stacks" / project
    if not root.exists():
        return []  # nothing stored yet (a new home): what `pulumi stack ls` lists, no engine start
    if not (root / "meta.yaml").is_file():
        return None
    if not stacks_dir.is_dir():
        return [] if not (root / "stacks").exists() else None
    found = []
    try:
        for checkpoint in sorted(stacks_dir.iterdir()):
            if not checkpoint.name.endswith((".json", ".json.gz")):
                continue  # backups, attributes, tags
            name = checkpoint.name.removesuffix(".gz").removesuffix(".json")
            tags_file = stacks_dir / f"{name}.pulumi-tags"
            tags = _load(tags_file).get("tags", {}) if tags_file.is_file() else {}
            found.append(StoredStack(name, dict(tags), resource_count(_load(checkpoint)), ()))
        wanted = set(updates(found)) if callable(updates) else \
            {s.name for s in found} if updates else set()
        return [replace(s, updates=_updates(root / "history" / project / s.name))
                if s.name in wanted else s for s in found]
    except (OSError, ValueError, AttributeError):
        return None  # a layout this reader does not know: the CLI knows
