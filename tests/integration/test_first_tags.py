"""A new stack's first tags in one write on the file backend (``engine/state_tags.py``), judged
by the built engine: ``stack tag ls`` reads them all, ``stack ls --tag`` filters on them, a later
``stack tag set`` keeps them, ``stack rm`` removes the file, and a stack that already has tags
is never overwritten (the engine's commands write instead)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward_iac.infra.engine.lean_stack import LeanStack
from skyward_iac.infra.engine.state_tags import write_first_tags
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks import stack as stack_module
from skyward_iac.infra.stacks.records import PROJECT
from skyward_iac.infra.stacks.stack_tags import tag_new_stack
from skyward_iac.infra.stacks.tags import TAG_PREFIX, encode_tags

TAGS = {"owner": "ana@host", "provider": "local", "lease_until": "2026-01-01T00:00:00+00:00",
        "region": "r" * 200, "zones": "z" * 200}  # in the run tag, chunked: run, run.1


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Path]:
    saved = dict(os.environ)
    root = tmp_path / "state"
    root.mkdir()
    os.environ["SKYWARD_BACKEND_URL"] = f"file://{root}"
    try:
        yield root
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _new_stack(name: str) -> LeanStack:
    return LeanStack.create(name, stack_module._workspace(None, home.secrets_provider()))


def _tags_file(root: Path, name: str) -> Path:
    return root / ".pulumi" / "stacks" / PROJECT / f"{name}.pulumi-tags"


def test_the_engine_reads_keeps_and_removes_the_tags_written_in_one_go(backend: Path) -> None:
    made = _new_stack("local-first-tags")
    started: list[str] = []
    made.set_tag = lambda key, value: started.append(key)  # type: ignore[method-assign]
    tag_new_stack(made, TAGS)
    assert started == []  # not one engine command
    wanted = {TAG_PREFIX + k: v for k, v in encode_tags(TAGS).items()}
    assert TAG_PREFIX + "run.1" in wanted
    engine_made = LeanStack.select(  # a fresh handle: no tags cached anywhere
        "local-first-tags", stack_module._workspace(None, home.secrets_provider()))
    listed = engine_made.workspace.list_tags("local-first-tags")
    assert {k: v for k, v in listed.items() if k.startswith(TAG_PREFIX)} == wanted
    filtered = engine_made._run_pulumi_cmd_sync(
        ["stack", "ls", "--json", "--tag", f"{TAG_PREFIX}owner=ana@host"])
    assert [s["name"] for s in json.loads(filtered.stdout)] == ["local-first-tags"]

    engine_made.set_tag(TAG_PREFIX + "down_by", "bo@host")  # the engine's read-modify-write
    after = engine_made.workspace.list_tags("local-first-tags")
    assert {k: v for k, v in after.items() if k.startswith(TAG_PREFIX)} == {
        **wanted, TAG_PREFIX + "down_by": "bo@host"}

    engine_made.workspace.remove_stack("local-first-tags")
    assert not _tags_file(backend, "local-first-tags").exists()
    assert not [p for p in _tags_file(backend, "x").parent.iterdir() if p.suffix == ".tmp"]


def test_tags_already_there_are_never_overwritten(backend: Path) -> None:
    made = _new_stack("local-tagged-before")
    made.set_tag(TAG_PREFIX + "owner", "first@host")
    before = _tags_file(backend, "local-tagged-before").read_bytes()
    assert not write_first_tags(backend, PROJECT, "local-tagged-before",
                                {TAG_PREFIX + "owner": "second@host"})
    assert _tags_file(backend, "local-tagged-before").read_bytes() == before
    # ... and so tag_new_stack asks the engine, which adds to what is there.
    tag_new_stack(made, {"provider": "local"})
    listed = made.workspace.list_tags("local-tagged-before")
    assert listed[TAG_PREFIX + "owner"] == "first@host"
    assert listed[TAG_PREFIX + "provider"] == "local"


def test_no_checkpoint_or_no_known_layout_writes_nothing(tmp_path: Path) -> None:
    assert not write_first_tags(tmp_path, PROJECT, "local-nowhere", {"skyward:owner": "a"})
    (tmp_path / ".pulumi" / "stacks" / PROJECT).mkdir(parents=True)
    (tmp_path / ".pulumi" / "meta.yaml").write_text("version: 1\n")
    assert not write_first_tags(tmp_path, PROJECT, "local-nowhere", {"skyward:owner": "a"})
    assert list((tmp_path / ".pulumi" / "stacks" / PROJECT).iterdir()) == []
