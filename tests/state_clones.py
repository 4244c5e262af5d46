"""Many recorded runs in a Pulumi backend, made from one real run: the objects the engine wrote
for a template stack (checkpoint, tags, history records and their checkpoint copies) copied
under new stack names, with the name rewritten inside them and the tags changed as asked.

Recording 1,000 runs through the engine would take hours; listing them is what is measured
(bench/team_listing.py, tests/integration/test_team_listing.py), and a copy is byte for byte
what the engine wrote but for the name and the tags. The engine reads the copies as stacks of
their own (the tests check ``pulumi stack ls`` and a copy's history through the engine).
Backups (``.pulumi/backups/``) are not copied: nothing lists them.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from skyward_iac.infra.stacks.tags import TAG_PREFIX, decode_tags, encode_tags

PROJECT = "skyward"
TagEdit = Callable[[int, dict[str, str]], dict[str, str]]


def template_objects(objects: dict[str, bytes], name: str) -> dict[str, bytes]:
    """The objects of stack ``name`` among a backend's ``objects`` (key -> body)."""
    stacks = f".pulumi/stacks/{PROJECT}/{name}."
    history = f".pulumi/history/{PROJECT}/{name}/"
    return {key: body for key, body in objects.items()
            if key.startswith((stacks, history))}


def clone_name(created: datetime, owner: str = "team") -> str:
    """A stack name as ``new_stack_name`` makes them."""
    return f"local-{owner}-{created:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def spread(index: int, tags: dict[str, str]) -> dict[str, str]:
    """The default tag edit: runs an hour apart going back in time, five owners, two teams."""
    created = datetime(2026, 11, 1, tzinfo=UTC) - timedelta(hours=index)
    owner = f"user{index % 5}@machine-{index % 3}"
    return {**tags, "created_at": created.isoformat(timespec="seconds"), "owner": owner,
            "tag.team": "ml" if index % 2 else "infra"}


def clones(template: dict[str, bytes], name: str, count: int,
           edit: TagEdit = spread) -> Iterable[tuple[str, dict[str, bytes]]]:
    """``count`` copies of the template stack ``name``: (new name, its objects)."""
    for index in range(count):
        tags_key = f".pulumi/stacks/{PROJECT}/{name}.pulumi-tags"
        stored = json.loads(template[tags_key])
        skyward = decode_tags({k.removeprefix(TAG_PREFIX): v for k, v in stored["tags"].items()
                               if k.startswith(TAG_PREFIX)})
        changed = edit(index, skyward)
        created = datetime.fromisoformat(changed["created_at"])
        # The run's updates move with its creation time: it lasts as long as the template.
        shift = (created - datetime.fromisoformat(skyward["created_at"])).total_seconds()
        new = clone_name(created, changed.get("owner", "team").split("@")[0])
        tags = {k: v for k, v in stored["tags"].items() if not k.startswith(TAG_PREFIX)}
        tags.update({TAG_PREFIX + k: v for k, v in encode_tags(changed).items()})
        objects = {}
        for key, body in template.items():
            if key == tags_key:
                body = json.dumps({**stored, "tags": tags}).encode()
            elif key.endswith(".history.json"):
                info = json.loads(body)
                for field in ("startTime", "endTime"):
                    if info.get(field):
                        info[field] = int(info[field] + shift)
                body = json.dumps(info).encode()
            objects[key.replace(name, new)] = body.replace(name.encode(), new.encode())
        yield new, objects


def put_s3(client: Any, bucket: str, objects: dict[str, bytes], workers: int = 16) -> None:
    """Write ``objects`` to ``bucket`` in parallel."""
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda item: client.put_object(Bucket=bucket, Key=item[0], Body=item[1]),
                      objects.items()))


def put_files(root: Path, objects: dict[str, bytes]) -> None:
    """Write ``objects`` under the file backend at ``root``."""
    for key, body in objects.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)


def s3_objects(client: Any, bucket: str) -> dict[str, bytes]:
    """Every object of ``bucket`` (but backups), by key."""
    keys = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket) for item in page.get("Contents") or []]
    return {key: client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys
            if not key.startswith(".pulumi/backups/")}


def file_objects(root: Path) -> dict[str, bytes]:
    """Every file of the file backend at ``root`` (but backups and locks), by key."""
    return {str(path.relative_to(root)): path.read_bytes()
            for path in (root / ".pulumi").rglob("*") if path.is_file()
            and not str(path.relative_to(root)).startswith((".pulumi/backups/",
                                                             ".pulumi/locks/"))}
