"""A new stack's first tags, written into the file backend in one step instead of one engine
start per tag.

``pulumi stack tag set`` takes one tag and costs an engine start (~0.23 CPU-s); a new pool's
stack gets five (``owner``, ``provider``, ``lease_until``, ``run``, ``run.1``), a tenth of a
Local pool's CPU. The DIY backend keeps a stack's tags as one JSON object beside its checkpoint
(pulumi/pulumi v3.274.1, pkg/backend/diy/stack_tags.go: ``stackTagsPath`` is
``<StackBasePath>.pulumi-tags``, ``saveStackTags`` writes ``{"version": 1, "tags": {...}}``),
which ``stack tag set`` reads, changes and writes back whole (cmd/pulumi/stack/stack_tag.go,
``tags := s.Tags(); tags[name] = value; backend.UpdateStackTags``) under no lock; an update
neither reads nor writes it (only ``stack tag set/rm`` and ``stack rm``, state.go, touch it).

So a stack that ``stack init`` has just made (its checkpoint is there) and that has no tags file
yet gets the whole file here: written to a temporary file and linked into place, so a reader
sees no tags or all of them (five commands left a second with some), and a tags file someone
else wrote meanwhile is never overwritten (the link fails; the caller then asks the engine).
A file the engine's blob store (gocloud fileblob) did not write has no ``.attrs`` sidecar (its
content type and md5), which the store reads as default attributes (fileblob/attrs.go
``getAttrs``): the file is read unverified until the engine next writes it with a sidecar.
That is also why only a first write is made here: a sidecar beside an older file would hold
that file's md5. Any other backend, or a layout not the known one, writes nothing here: the
caller asks the engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

#: ``stackTagsVersion`` of stack_tags.go: the one format of the tags file.
TAGS_VERSION = 1


def write_first_tags(backend_dir: Path, project: str, stack: str,
                     tags: Mapping[str, str]) -> bool:
    """Write ``tags`` (full names, prefix included) as the first tags of ``stack`` in the file
    backend at ``backend_dir``; False, with nothing written, when the layout is not the known
    one, the stack's checkpoint is missing, or the stack already has a tags file."""
    stacks = backend_dir / ".pulumi" / "stacks" / project
    if not (backend_dir / ".pulumi" / "meta.yaml").is_file() or not any(
            (stacks / f"{stack}{suffix}").is_file() for suffix in (".json", ".json.gz")):
        return False
    target = stacks / f"{stack}.pulumi-tags"
    if target.exists() or target.with_name(target.name + ".attrs").exists():
        return False  # a sidecar left alone would hold another content's md5: reads would fail
    data = json.dumps({"version": TAGS_VERSION, "tags": dict(tags)}, indent=4).encode()
    # Named as the engine's unfinished writes are (``<name>.<hex>.tmp``), so that one a crash
    # left behind is removed by state_repair like theirs; 0o666 less the umask, as theirs.
    tmp = stacks / f"{target.name}.{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.link(tmp, target)  # fails if the file appeared meanwhile: never overwrite it
    except OSError:
        return False  # it appeared, or this file system links no files: the engine writes
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return True
