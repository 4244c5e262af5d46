"""The state repair rule on a file backend laid out as the engine leaves it after a failed
write: empty files removed, broken ones with content moved aside, broken checkpoints restored
from the newest sound copy (or only reported), young files left to their writer."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from skyward_iac.infra.engine import state_repair
from skyward_iac.infra.engine.state_repair import (
    QUARANTINE,
    SETTLE,
    SETTLE_SMALL,
    broken_files,
    remedy,
    repair,
    settle_time,
)

LOCKS = ".pulumi/locks/organization/skyward"
STACKS = ".pulumi/stacks/skyward"
CHECKPOINT = {"version": 3, "checkpoint": {"stack": "s", "latest": {"resources": []}}}


@pytest.mark.parametrize(("path", "size", "sound", "restorable", "expected"), [
    # What a full disk leaves: a lock never written, a temporary file with a whole checkpoint.
    (f"{LOCKS}/s/1.json.18eb64b46d271995.tmp", 0, None, False, "remove"),
    (f"{STACKS}/s.json.18eb64b46d271995.tmp", 900, None, False, "quarantine"),
    # A lock cut short, a sound lock (someone's: left alone).
    (f"{LOCKS}/s/1.json", 40, False, False, "quarantine"),
    (f"{LOCKS}/s/1.json", 300, True, False, None),
    # Checkpoints: restored when a sound copy is kept, else only reported.
    (f"{STACKS}/s.json", 0, None, True, "restore"),
    (f"{STACKS}/s.json", 500, False, True, "restore"),
    (f"{STACKS}/s.json", 0, None, False, "report"),
    (f"{STACKS}/s.json", 500, True, False, None),
    # Sidecars, tags, history and backups: empty ones go, broken ones with content move aside.
    (f"{STACKS}/s.json.attrs", 0, None, False, "remove"),
    (f"{STACKS}/s.json.attrs", 30, False, False, "quarantine"),
    (f"{STACKS}/s.pulumi-tags", 0, None, False, "remove"),
    (".pulumi/history/skyward/s/s-1.history.json", 0, None, False, "remove"),
    (".pulumi/history/skyward/s/s-1.history.json", 900, None, False, None),  # not parsed
    (".pulumi/backups/skyward/s/s.17.json", 0, None, False, "remove"),
])
def test_the_rule(path: str, size: int, sound: bool | None, restorable: bool,
                  expected: str | None) -> None:
    assert remedy(path, size, sound, restorable) == expected


def test_only_temporary_files_outside_the_locks_wait_for_a_writer() -> None:
    assert settle_time(f"{STACKS}/s.json.18eb64b46d271995.tmp") == SETTLE
    for quick in (f"{LOCKS}/s/1.json.18eb64b46d271995.tmp", f"{LOCKS}/s/1.json",
                  f"{STACKS}/s.json", f"{STACKS}/s.json.attrs", f"{STACKS}/s.pulumi-tags"):
        assert settle_time(quick) == SETTLE_SMALL
    assert SETTLE_SMALL < SETTLE


def write(root: Path, path: str, content: str | bytes, age: float = 60.0) -> Path:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content.encode() if isinstance(content, str) else content)
    when = time.time() - age
    os.utime(target, (when, when))
    return target


def test_what_a_full_disk_left_is_mended_and_named(tmp_path: Path) -> None:
    sound = json.dumps(CHECKPOINT)
    lock_tmp = write(tmp_path, f"{LOCKS}/s1/a.json.18eb64b46d271995.tmp", "")
    cut_lock = write(tmp_path, f"{LOCKS}/s1/b.json", '{"pid": 12')
    write(tmp_path, f"{LOCKS}/s1/b.json.attrs", '{"md5": "x"}')
    held = write(tmp_path, f"{LOCKS}/s1/c.json", '{"pid": 1, "hostname": "h"}')
    # s2: the checkpoint renamed into place empty, its sidecar describing the empty content.
    empty = write(tmp_path, f"{STACKS}/s2.json", "")
    write(tmp_path, f"{STACKS}/s2.json.attrs", '{"md5": "1B2M2Y8AsgTpgAmY7PhCfg=="}')
    write(tmp_path, f"{STACKS}/s2.json.bak", sound)
    whole_tmp = write(tmp_path, f"{STACKS}/s2.json.18eb650e00cf7a0e.tmp", sound)
    empty_backup = write(tmp_path, ".pulumi/backups/skyward/s2/s2.1795639987345972192.json", "")
    # s3: cut short, no .bak: its newest history copy (not the older backup) comes back.
    cut = write(tmp_path, f"{STACKS}/s3.json", '{"version": 3, "checkp')
    newer = {**CHECKPOINT, "checkpoint": {"stack": "s3", "latest": {"resources": [1]}}}
    write(tmp_path, ".pulumi/history/skyward/s3/s3-2.checkpoint.json", json.dumps(newer), 30)
    write(tmp_path, ".pulumi/backups/skyward/s3/s3.1.json", sound, 90)
    # s4: empty and no copy anywhere: reported, left.
    lost = write(tmp_path, f"{STACKS}/s4.json", "")
    tags = write(tmp_path, f"{STACKS}/s5.pulumi-tags", "")
    meta = write(tmp_path, ".pulumi/meta.yaml", "")  # never judged: not the engine's JSON
    young = write(tmp_path, f"{STACKS}/s6.json.18eb650e00cf7a0f.tmp", "", age=0)

    lines = repair(tmp_path)

    said = "\n".join(lines)
    for gone in (lock_tmp, empty_backup, tags):
        assert not gone.exists() and f"removed the empty {gone.relative_to(tmp_path)}" in said
    assert not (tmp_path / f"{LOCKS}/s1/b.json.attrs").exists()  # went with its blob
    quarantine = next((tmp_path / QUARANTINE).iterdir())
    for aside in (cut_lock, whole_tmp, cut):  # the broken s3.json too, before its restore
        assert (quarantine / aside.relative_to(tmp_path)).is_file()
        assert f"{aside.relative_to(tmp_path)} aside to" in said or aside == cut
    assert not cut_lock.exists() and not whole_tmp.exists()
    assert (quarantine / f"{LOCKS}/s1/b.json.attrs").is_file()
    assert json.loads((quarantine / whole_tmp.relative_to(tmp_path)).read_text()) == CHECKPOINT
    assert held.exists()
    assert json.loads(empty.read_text()) == CHECKPOINT
    assert not (tmp_path / f"{STACKS}/s2.json.attrs").exists()  # it described the empty one
    assert f"restored {STACKS}/s2.json from {STACKS}/s2.json.bak" in said
    assert json.loads(cut.read_text()) == newer
    assert f"restored {STACKS}/s3.json from .pulumi/history/skyward/s3/s3-2.checkpoint.json" \
        in said
    assert "; resources created after that copy was taken are not in it" in said
    assert lost.exists() and f"{STACKS}/s4.json is broken and no sound copy" in said
    assert meta.exists() and young.exists()
    assert len(lines) == 8
    assert repair(tmp_path) == [(f"{STACKS}/s4.json is broken and no sound copy of it is "
                                 "kept; left in place: restore it by hand, or remove the stack "
                                 "with `pulumi stack rm --force`")]


def test_nothing_is_touched_in_a_sound_backend_or_none(tmp_path: Path) -> None:
    assert repair(tmp_path) == []
    write(tmp_path, f"{STACKS}/s.json", json.dumps(CHECKPOINT))
    write(tmp_path, f"{STACKS}/s.json.attrs", '{"md5": "x"}')
    write(tmp_path, f"{LOCKS}/s/a.json", '{"pid": 1}')
    assert repair(tmp_path) == [] and broken_files(tmp_path, settled_only=False) == []


def test_a_file_a_writer_may_still_hold_is_named_but_left(tmp_path: Path) -> None:
    young = write(tmp_path, f"{LOCKS}/s/a.json.18eb64b46d271995.tmp", "", age=0)
    assert broken_files(tmp_path) == []
    assert broken_files(tmp_path, settled_only=False) == [(young, "remove")]
    os.utime(young, (time.time() - SETTLE_SMALL - 1,) * 2)
    assert broken_files(tmp_path) == [(young, "remove")]


def test_a_compressed_checkpoint_is_never_restored_by_hand(tmp_path: Path) -> None:
    write(tmp_path, f"{STACKS}/s.json.gz", b"")
    write(tmp_path, f"{STACKS}/s.json.gz.bak", b"\x1f\x8b")
    assert state_repair.restore_source(tmp_path, f"{STACKS}/s.json.gz") is None
    assert broken_files(tmp_path) == [(tmp_path / f"{STACKS}/s.json.gz", "report")]


def test_a_backup_older_than_the_last_updates_copy_loses_to_it(tmp_path: Path) -> None:
    # The .bak copy failed on the full disk, so the one left predates the last finished update.
    stale = {**CHECKPOINT, "checkpoint": {"stack": "s", "latest": {"resources": [1]}}}
    last = {**CHECKPOINT, "checkpoint": {"stack": "s", "latest": {"resources": [1, 2]}}}
    write(tmp_path, f"{STACKS}/s.json", "")
    write(tmp_path, f"{STACKS}/s.json.bak", json.dumps(stale), age=600)
    kept = write(tmp_path, ".pulumi/history/skyward/s/s-9.checkpoint.json", json.dumps(last), 60)
    assert state_repair.restore_source(tmp_path, f"{STACKS}/s.json") == kept
    repair(tmp_path)
    assert json.loads((tmp_path / f"{STACKS}/s.json").read_text()) == last
