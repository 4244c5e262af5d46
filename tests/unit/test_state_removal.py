"""The direct removal's own decisions on a file backend laid out as the engine lays it out
(``engine/state_removal.py``): what counts as empty, and what it leaves to the engine."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from skyward_iac.infra.engine import state_removal
from skyward_iac.infra.engine.state_removal import FileStore, is_empty, remove_empty

STACK = "local-x-20260101-000000-abcdef"


def _checkpoint(resources: list[dict[str, str]], pending: list[object] | None = None) -> bytes:
    latest: dict[str, object] = {"resources": resources}
    if pending:
        latest["pending_operations"] = pending
    return json.dumps({"version": 3, "checkpoint": {"stack": STACK, "latest": latest}}).encode()


def test_empty_is_no_resource_but_a_lone_root_stack_and_no_pending_operation() -> None:
    assert is_empty(json.loads(_checkpoint([])))
    assert is_empty({"version": 3, "checkpoint": {"stack": STACK}})  # never updated
    assert is_empty(json.loads(_checkpoint([{"type": "pulumi:pulumi:Stack"}])))
    assert not is_empty(json.loads(_checkpoint([{"type": "pulumi:providers:command"}])))
    assert not is_empty(json.loads(_checkpoint([{"type": "pulumi:pulumi:Stack"},
                                                {"type": "skyward:local:Node"}])))
    assert not is_empty(json.loads(_checkpoint([], pending=[{"type": "creating"}])))


def _backend(tmp_path: Path, checkpoint_name: str) -> FileStore:
    store = FileStore(tmp_path)
    store.put(".pulumi/meta.yaml", b"version: 1\n")
    store.put(f".pulumi/stacks/skyward/{checkpoint_name}", _checkpoint([]))
    store.put(f".pulumi/stacks/skyward/{STACK}.pulumi-tags", b'{"version": 1, "tags": {}}')
    store.put(f".pulumi/history/skyward/{STACK}/{STACK}-1.history.json", b"{}")
    return store


def test_a_form_not_handled_is_left_to_the_engine_untouched(tmp_path: Path) -> None:
    store = _backend(tmp_path, f"{STACK}.json.zst")
    before = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert remove_empty(store, "skyward", STACK) == state_removal.UNKNOWN
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == before  # its lock went too
    store.put(f".pulumi/stacks/skyward/{STACK}.json", _checkpoint([]))  # .json and .json.zst
    assert remove_empty(store, "skyward", STACK) == state_removal.UNKNOWN


def test_a_gzip_checkpoint_and_fileblob_attributes_go(tmp_path: Path) -> None:
    _backend(tmp_path, f"{STACK}.json.gz")
    (tmp_path / f".pulumi/stacks/skyward/{STACK}.json.gz").write_bytes(gzip.compress(
        _checkpoint([])))
    (tmp_path / f".pulumi/stacks/skyward/{STACK}.json.gz.attrs").write_text("{}")
    (tmp_path / f".pulumi/stacks/skyward/{STACK}-other.json").write_bytes(_checkpoint([]))
    assert state_removal.remove_empty_stacks(f"file://{tmp_path}", "skyward", [STACK]) == {
        STACK: state_removal.REMOVED}
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == [".pulumi/meta.yaml", f".pulumi/stacks/skyward/{STACK}-other.json"]


def test_another_layout_is_left_to_the_engine(tmp_path: Path) -> None:
    _backend(tmp_path, f"{STACK}.json").put(".pulumi/meta.yaml", b"version: 0\n")
    assert state_removal.remove_empty_stacks(f"file://{tmp_path}", "skyward", [STACK]) == {
        STACK: state_removal.UNKNOWN}
    assert (tmp_path / f".pulumi/stacks/skyward/{STACK}.json").exists()
