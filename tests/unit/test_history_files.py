"""Reading the file backend's stack records straight from disk (fast ``history`` and ``gc``)."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime
from pathlib import Path

from skyward_iac.infra.engine.state_files import read_stacks


def write(path: Path, document: object, compress: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(document).encode()
    path.write_bytes(gzip.compress(data) if compress else data)


def backend(tmp_path: Path) -> Path:
    root = tmp_path / ".pulumi"
    root.mkdir()
    (root / "meta.yaml").write_text("version: 1\n")
    stacks = root / "stacks" / "skyward"
    write(stacks / "run-a.json", {"version": 3, "checkpoint": {"latest": {"resources": [{}, {}]}}})
    (stacks / "run-a.json.bak").write_text("{not json")  # backups and attributes are skipped
    (stacks / "run-a.json.attrs").write_text("{}")
    write(stacks / "run-a.pulumi-tags", {"version": 1, "tags": {"skyward:nodes": "2"}})
    write(stacks / "run-b.json.gz", {"version": 3, "checkpoint": {"latest": {}}}, compress=True)
    history = root / "history" / "skyward" / "run-a"
    write(history / "run-a-1.history.json",
          {"kind": "update", "result": "succeeded", "message": "up", "startTime": 100,
           "endTime": 110})
    write(history / "run-a-2.history.json",
          {"kind": "destroy", "result": "succeeded", "message": "skyward: pool closed",
           "startTime": 200, "endTime": 205})
    return tmp_path


def test_stacks_tags_counts_and_updates_newest_first(tmp_path: Path) -> None:
    stacks = {s.name: s for s in read_stacks(backend(tmp_path), "skyward") or []}
    assert sorted(stacks) == ["run-a", "run-b"]
    a, b = stacks["run-a"], stacks["run-b"]
    assert a.tags == {"skyward:nodes": "2"} and a.resource_count == 2
    assert [(u.kind, u.message) for u in a.updates] == [
        ("destroy", "skyward: pool closed"), ("update", "up")]
    assert a.updates[0].end_time == datetime.fromtimestamp(205, UTC)
    assert b.tags == {} and b.resource_count == 0 and b.updates == ()


def test_a_backend_with_nothing_stored_has_no_stacks(tmp_path: Path) -> None:
    """A new home's file backend (no ``.pulumi`` yet) lists no stack without asking the engine
    (a pool's first gc in a new home cost a `pulumi stack ls`)."""
    assert read_stacks(tmp_path, "skyward") == []
    assert read_stacks(tmp_path / "not-made-yet", "skyward") == []


def test_unknown_layouts_defer_to_the_cli(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy"
    (legacy / ".pulumi" / "stacks").mkdir(parents=True)
    assert read_stacks(legacy, "skyward") is None  # no meta.yaml: a layout not known here
    root = backend(tmp_path)
    (root / ".pulumi" / "stacks" / "skyward" / "run-c.json").write_text("{broken")
    assert read_stacks(root, "skyward") is None
