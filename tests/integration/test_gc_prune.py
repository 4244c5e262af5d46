"""gc's prune of old empty stacks, straight from the backend (``engine/state_removal.py``): on
the file backend and on moto's S3 (with KMS secrets), with the built engine making the stacks
and judging the result (``pulumi stack ls``). A pruned stack is gone as the engine sees it, no
engine process is started for it, a locked stack or one holding resources is left, and a
backend the direct removal does not handle goes through the engine's ``stack rm``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from skyward_iac.infra.engine import state_removal
from skyward_iac.infra.engine.lean_stack import LeanStack
from skyward_iac.infra.stacks import gc, home
from skyward_iac.infra.stacks import stack as stack_module
from skyward_iac.infra.stacks.records import PROJECT
from skyward_iac.infra.stacks.stack import workspace_for_listing
from skyward_iac.infra.stacks.tags import TAG_PREFIX, encode_tags
from tests.integration.test_team_listing import _watching  # its audit hook counts starts
from tests.s3_server import s3_server, team_state_env
from tests.state_clones import (
    clones,
    file_objects,
    put_files,
    put_s3,
    s3_objects,
    template_objects,
)

BUCKET = "team-prune"
COPIES = 5
# Stacks are made through the engine (a few starts each): minutes on a loaded machine.
pytestmark = pytest.mark.timeout(900)


@dataclass
class Backend:
    """A backend with a template stack and its copies, and how to write and read objects."""

    kind: str
    template: str
    copies: list[str]
    client: Any = None
    root: Path | None = None

    def put(self, objects: dict[str, bytes]) -> None:
        if self.client is not None:
            put_s3(self.client, BUCKET, objects)
        else:
            assert self.root is not None
            put_files(self.root, objects)

    def objects(self) -> dict[str, bytes]:
        if self.client is not None:
            return s3_objects(self.client, BUCKET)
        assert self.root is not None
        return file_objects(self.root)

    def stored_keys(self) -> set[str]:
        if self.client is not None:
            return {item["Key"] for page in self.client.get_paginator(
                "list_objects_v2").paginate(Bucket=BUCKET) for item in page.get("Contents") or []}
        assert self.root is not None
        return {str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file()}


def _make_template(name: str) -> None:
    """An empty stack made and tagged by the engine, created long ago (prunable)."""
    workspace = stack_module._workspace(None, home.secrets_provider())
    made = LeanStack.create(name, workspace)
    tags = {"created_at": "2026-01-01T00:00:00+00:00", "owner": "someone@elsewhere"}
    for key, value in encode_tags(tags).items():
        made.set_tag(TAG_PREFIX + key, value)


def _filled(made: Backend) -> Backend:
    """``made`` with its template stack (through the engine) and ``COPIES`` copies of it."""
    _make_template(made.template)
    copies = dict(clones(template_objects(made.objects(), made.template), made.template,
                         COPIES))
    made.copies = sorted(copies)
    made.put({k: v for objects in copies.values() for k, v in objects.items()})
    return made


@pytest.fixture(params=["file", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    saved = dict(os.environ)
    name = f"local-prune-{request.param}-template"
    try:
        if request.param == "file":
            root = tmp_path / "state"
            root.mkdir()
            os.environ["SKYWARD_BACKEND_URL"] = f"file://{root}"
            yield _filled(Backend("file", name, [], root=root))
        else:
            with s3_server(timeout=120) as server:
                os.environ.update(team_state_env(server, BUCKET))
                client = boto3.client("s3", endpoint_url=server.endpoint,
                                      region_name="us-east-1",
                                      aws_access_key_id=server.access_key,
                                      aws_secret_access_key=server.secret_key)
                yield _filled(Backend("s3", name, [], client=client))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _collect(only: list[str]) -> tuple[list[gc.Action], list[str]]:
    started: list[str] = []
    _watching.append(started)
    try:
        return gc.collect(retention_days=1, only=only), started
    finally:
        _watching.remove(started)


def _engine_stacks() -> set[str]:
    """The stacks the engine lists (``pulumi stack ls``)."""
    return {s.name.rsplit("/", 1)[-1] for s in workspace_for_listing().list_stacks()}


def test_prune_removes_empty_stacks_without_the_engine(backend: Backend) -> None:
    plain, locked, *rest = backend.copies
    lock = f"{state_removal.lock_dir(PROJECT, locked)}a-running-update.json"
    backend.put({lock: json.dumps({"pid": 1, "username": "u", "hostname": "h",
                                   "timestamp": "2026-11-26T00:00:00Z"}).encode()})
    (home.workspace_dir() / f"Pulumi.{plain}.yaml").write_text("config: {}\n")
    before = _engine_stacks()
    assert {backend.template, *backend.copies} <= before
    actions, started = _collect([backend.template, plain, locked, *rest])
    assert not [p for p in started if "pulumi" in p], started  # no engine start at all
    done = {a.stack: a.action for a in actions}
    assert done == {backend.template: "pruned", plain: "pruned", locked: "skipped",
                    **dict.fromkeys(rest, "pruned")}
    after = _engine_stacks()
    assert locked in after
    assert not {backend.template, plain, *rest} & after
    # Nothing of a pruned stack is left (checkpoint, .bak, tags, history, backups, lock) but
    # the lock another writer holds; its settings file went too, as with `stack rm`.
    left = [k for k in backend.stored_keys() if plain in k or backend.template in k]
    assert left == [], left
    assert {k for k in backend.stored_keys() if locked in k and "/locks/" in k} == {lock}
    assert not (home.workspace_dir() / f"Pulumi.{plain}.yaml").exists()


def test_a_stack_with_resources_is_left(backend: Backend) -> None:
    """Emptiness is checked again right before deleting: a stack the listing saw empty that
    holds a resource now is left as it is."""
    victim = backend.copies[0]
    key = next(k for k in backend.objects()
               if k == f".pulumi/stacks/{PROJECT}/{victim}.json")
    checkpoint = json.loads(backend.objects()[key])
    latest = checkpoint["checkpoint"].setdefault("latest", {}) or {}
    checkpoint["checkpoint"]["latest"] = latest
    latest["resources"] = [{"urn": f"urn:pulumi:{victim}::{PROJECT}::skyward:local:Node::n0",
                            "custom": False, "type": "skyward:local:Node"}]
    backend.put({key: json.dumps(checkpoint).encode()})
    url = home.backend_url()
    assert state_removal.remove_empty_stacks(url, PROJECT, [victim]) == {
        victim: state_removal.NOT_EMPTY}
    assert victim in _engine_stacks()
    # and gc's own judgement leaves it too (it holds a resource: not prunable)
    actions, _ = _collect([victim])
    assert not [a for a in actions if a.stack == victim and a.action == "pruned"]
    assert victim in _engine_stacks()


def test_a_backend_not_handled_goes_through_the_engine(backend: Backend,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the direct removal has no store (a gs:// or azblob:// backend, a file URL with
    options), the engine's ``stack rm`` removes the stack: one engine start or more."""
    victim = backend.copies[0]
    monkeypatch.setattr(state_removal, "store_for", lambda url: None)
    actions, started = _collect([victim])
    assert [(a.stack, a.action) for a in actions] == [(victim, "pruned")]
    assert [p for p in started if "pulumi" in p]
    assert victim not in _engine_stacks()
