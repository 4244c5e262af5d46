"""Every stack of the backend with its tags and resource count (``ls``, ``history``, ``cost``,
gc): read straight from the backend's files or objects where their layout is known, so a
listing costs no engine start per stack, whatever the team's size.

The file backend is read from disk (``engine/state_files.py``), an S3 backend from its bucket
(``engine/state_s3.py``); any other backend, or one of those not readable here, through the
engine, one command per stack.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from skyward_iac.infra.engine import state_files, state_s3
from skyward_iac.infra.engine.state_files import StoredStack
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.tags import TAG_PREFIX, StackRecord, skyward_tags

if TYPE_CHECKING:  # the engine's API costs a second to import: only the fallback needs it
    import pulumi.automation as auto

PROJECT = "skyward"
#: The Pulumi projects of the checkout's ``stacks/`` (their ``Pulumi.yaml`` names): clusters an
#: ops team runs with the pulumi CLI, listed beside the pools (``ls``, ``history``, gc).
OPS_PROJECTS = ("skyward-local", "skyward-aws", "skyward-gcp")


def stored_stacks(updates: state_files.Updates = False) -> list[StoredStack] | None:
    """The backend's stacks (raw tags, resource counts and, with ``updates``, the update
    histories of all or of those it picks) read without the engine; None when the backend
    cannot be read so."""
    directory = home.file_backend()
    if directory is not None:
        return state_files.read_stacks(directory, PROJECT, updates)
    url = home.backend_url()
    if url.startswith("s3://"):
        return state_s3.read_stacks(url, PROJECT, cache_file(url), updates=updates)
    return None


def ops_clusters(updates: bool = False) -> list[StoredStack]:
    """The stacks of ``stacks/``'s projects in the backend in force, named ``PROJECT/STACK``
    (with their update histories when ``updates``); only where the backend is read directly
    (file, S3): through the engine each project would cost engine starts of its own."""
    found: list[StoredStack] = []
    directory, url = home.file_backend(), home.backend_url()
    for project in OPS_PROJECTS:
        if directory is not None:
            stacks = state_files.read_stacks(directory, project, updates)
        elif url.startswith("s3://"):  # a cache of its own: each keeps only what it read
            stacks = state_s3.read_stacks(url, project, cache_file(f"{url}#{project}"),
                                          updates=updates)
        else:
            stacks = None
        found += [replace(s, name=f"{project}/{s.name}") for s in stacks or ()]
    return found


def cache_file(url: str) -> Any:
    """Where what was read of the backend at ``url`` is kept for the next look."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return home.skyward_home() / "cache" / f"backend-{digest}.json"


def list_records(only_live: bool = False) -> list[StackRecord]:
    """Every skyward stack in the backend with its tags and resource count (gc, history).

    Read without the engine when the backend allows (``stored_stacks``). Through the engine,
    ``only_live`` skips reading the tags of empty (destroyed) stacks, one command each, but
    for the stacks of plans not applied yet (found in one command: gc expires them).
    """
    stored = stored_stacks()
    if stored is not None:
        return [StackRecord(s.name, skyward_tags(s.tags), s.resource_count) for s in stored]
    from skyward_iac.infra.stacks.stack import workspace_for_listing

    workspace = workspace_for_listing()
    planned = _tagged(workspace, TAG_PREFIX + "plan_expires") if only_live else set()
    records = []
    for summary in workspace.list_stacks():
        name, count = summary.name.rsplit("/", 1)[-1], summary.resource_count or 0
        tags: dict[str, str] = {}
        if count or not only_live or name in planned:
            tags = skyward_tags(workspace.list_tags(name))
        if count:  # the engine's count has the stack and its providers: count as `show` does
            count = managed_count(workspace.export_stack(name).deployment or {})
        records.append(StackRecord(name, tags, count))
    return records


def managed_count(deployment: Mapping[str, Any]) -> int:
    """The resources of an exported deployment, the stack itself and providers left out (what
    ``ls``, ``show`` and ``history`` call a stack's resources)."""
    return sum(1 for r in deployment.get("resources", []) if not r["type"].startswith("pulumi:"))


def _tagged(workspace: auto.LocalWorkspace, tag: str) -> set[str]:
    """The names of the stacks that carry ``tag`` (the engine filters, in one command)."""
    result = workspace.pulumi_command.run(["stack", "ls", "--json", "--tag", tag],
                                          workspace.work_dir, workspace.env_vars)
    return {entry["name"].rsplit("/", 1)[-1] for entry in json.loads(result.stdout or "[]")}
