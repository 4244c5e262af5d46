"""The tags every pool's stack carries: what ops teams filter on, what gc and history read.

Pure functions (plus reading this process's identity); no Pulumi import. ``stack.py`` writes
them, ``gc.py`` and the CLI read them.
"""

from __future__ import annotations

import getpass
import importlib.metadata
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from skyward_iac.api.deadlines import expires_at, lease_end

if TYPE_CHECKING:  # pydantic's models cost half a second to import; listings need none
    from skyward_iac.api.spec import Spec

#: Prefix of every skyward tag in the backend (``skyward:owner``...).
TAG_PREFIX = "skyward:"
#: The longest tag value and tag name a Pulumi backend takes: Pulumi Cloud refuses longer ones
#: (pulumi/pulumi v3.274.1, pkg/util/validation/stack.go: ``maxTagValue = 256`` in
#: ``ValidateStackTags``, ``maxTagName = 40`` in ``validateStackTagName``). The DIY backends
#: (file, S3) check neither, but a stack's tags must fit every backend: ``encode_tags`` splits
#: what would be longer into numbered chunks (``run``, ``run.1`` ...).
MAX_TAG_VALUE = 256
MAX_TAG_NAME = 40
#: The prefix of the user's own tags (``Options.tags``) among a stack's tags.
USER_TAG = "tag."
#: Tags ops teams filter on (``pulumi stack ls --tag skyward:owner=...``) and the ones written
#: on their own later (lease renewals, warm, taken down) stay separate; the rest travel in one
#: JSON tag, because every tag written costs one engine command (~0.13 s) on the way up.
SEPARATE_TAGS = ("owner", "provider", "actor", "down_by", "ended", "warm_until",
                 "lease_until", "plan_expires")
#: Set (to ``user@host``) by whoever destroys a pool's stack from outside it (``skyward-iac
#: down``, gc): the owner, if it still runs, must not bring the nodes back.
DOWN_BY = "down_by"
#: How the run ended and by whom, written by the one destroy path (``infra/stacks/destroy.py``)
#: once its destroy succeeded or failed: ``ended_value``'s compact JSON, read by ``ended_of``.
ENDED = "ended"
#: Set while a warm pool's keeper keeps the stack's nodes for their next user (ISO time).
WARM_UNTIL = "warm_until"
RUN_TAG = "run"
#: The prefix of the access log's entries (``infra/stacks/access.py``): each is a tag of its own.
ACCESS = "access."

# What ran, where and for whom: the audit (``skyward-iac history``, ``cost``).
#: Who ran the pool: on a cloud, the identity its credentials authenticated (AWS STS caller
#: ARN, GCP account), a tag of its own (``pulumi stack ls --tag skyward:actor=...``); absent
#: on Local, where the owner (``user@host``, self-declared) is the actor.
ACTOR = "actor"
#: How ``actor`` was learned: ``aws-sts``, ``gcp-service-account``, ``gcloud-account``, or
#: ``self-declared`` (``$USER@hostname``, which anyone can set).
ACTOR_SOURCE = "actor_source"
SELF_DECLARED = "self-declared"
#: Where the nodes run: the offer's instance type and region, the zones used (comma-separated,
#: "" when the provider chose and did not say) and the market (``spot``, ``on-demand``, or
#: ``spot, K of N on-demand`` after a spot fallback).
INSTANCE_TYPE, REGION, ZONES, MARKET = "instance_type", "region", "zones", "market"
#: The stack's nodes over time (``infra/stacks/usage.py``), chunked like ``run``; absent until
#: the first resize or fallback (the one segment is then implied by ``nodes``/``usd_per_hour``).
SEGMENTS = "segments"
#: Chunked tags: a value longer than ``MAX_TAG_VALUE`` is stored as ``KEY``, ``KEY.1`` ...
CHUNKED = (RUN_TAG, SEGMENTS)


@dataclass(frozen=True, slots=True)
class StackRecord:
    """What listings and gc need to know about one stack: its tags and resource count."""

    name: str
    tags: dict[str, str]
    resource_count: int


def process_started(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (tells a reused pid apart)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def boot_id() -> str:
    """This machine's current boot (a pid, a start time and the monotonic clock mean
    something only within one boot); empty where the kernel does not say."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True, slots=True)
class ProcessId:
    """A process on some machine: host name, boot, pid and start time, so that neither a reused
    pid nor a pid from an earlier boot passes for it. ``boot`` is empty in older records."""

    host: str
    boot: str
    pid: int
    started: str

    @classmethod
    def current(cls) -> ProcessId:
        """This process."""
        return cls(socket.gethostname(), boot_id(), os.getpid(),
                   process_started(os.getpid()) or "")

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> ProcessId | None:
        """The process ``owner_tags`` recorded, or None when no pid was."""
        try:
            pid = int(tags["pid"])
        except (KeyError, ValueError):
            return None
        return cls(tags.get("host", ""), tags.get("boot_id", ""), pid,
                   tags.get("pid_started", ""))

    def tags(self) -> dict[str, str]:
        """The inverse of ``from_tags``."""
        return {"pid": str(self.pid), "pid_started": self.started, "host": self.host,
                "boot_id": self.boot}


def local_actor() -> str:
    """``user@host`` of this process: who a Local run or an action on a stack is by (as the
    machine says it: anyone can set ``$USER``, so it is marked self-declared where it matters)."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def owner_tags() -> dict[str, str]:
    """Tags that identify this client process to a later collector."""
    return ProcessId.current().tags()


def placement_tags(instance_type: str, region: str, zones: Sequence[str], market: str,
                   on_demand_nodes: int = 0, nodes: int = 0) -> dict[str, str]:
    """Where a pool's nodes run, as tags: ``market`` says how many of a spot pool's ``nodes``
    the spot fallback moved on demand."""
    if market == "spot" and on_demand_nodes:
        market = f"spot, {on_demand_nodes} of {nodes} on-demand"
    return {INSTANCE_TYPE: instance_type, REGION: region,
            ZONES: ",".join(sorted({zone for zone in zones if zone})), MARKET: market}


def stack_tags(spec: Spec, node_count: int, now: datetime | None = None,
               usd_per_hour: float = 0.0,
               user_tags: Mapping[str, str] | None = None,
               placement: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tags every stack carries, read by ``gc``, ``history`` and ops teams; the user's
    (``Options.tags``) as ``tag.KEY``; ``placement``: where it runs (``placement_tags``)."""
    now = now or datetime.now(UTC)
    accelerator = spec.accelerator
    return {
        "owner": local_actor(),
        "created_at": now.isoformat(timespec="seconds"),
        "expires_at": expires_at(now, spec.ttl),
        "ttl": str(spec.ttl),
        "provider": spec.provider.kind,
        "nodes": str(node_count),
        "version": importlib.metadata.version("skyward_iac"),
        "accelerator": f"{accelerator.count:g}x{accelerator.name}" if accelerator else "cpu",
        "allocation": spec.allocation,
        "usd_per_hour": f"{usd_per_hour:.4f}",
        # The first lease; the owner renews it while the pool lives (infra/stacks/leases.py).
        **({"lease_until": lease_end(spec.ttl, now)} if spec.ttl else {}),
        **owner_tags(),
        **(placement or {}),
        **{f"{USER_TAG}{key}": value for key, value in (user_tags or {}).items()},
    }


def encode_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The backend form: separate tags, the rest as JSON in ``run`` chunks, and ``segments``
    in chunks; every value within ``MAX_TAG_VALUE`` (a separate one is cut to it)."""
    separate = {k: v[:MAX_TAG_VALUE] for k, v in tags.items()
                if k in SEPARATE_TAGS or k.startswith(ACCESS)}
    rest = {k: v for k, v in tags.items() if k not in separate and k != SEGMENTS}
    stored = {**separate, **_chunked(RUN_TAG, _json_chunks(rest))}
    if tags.get(SEGMENTS):
        stored.update(_chunked(SEGMENTS, word_chunks(tags[SEGMENTS].split())))
    return stored


def _chunked(key: str, chunks: list[str]) -> dict[str, str]:
    return {key if index == 0 else f"{key}.{index}": chunk for index, chunk in enumerate(chunks)}


def _json_chunks(values: Mapping[str, str]) -> list[str]:
    """``values`` as JSON objects of at most ``MAX_TAG_VALUE`` characters each (keys sorted,
    packed in order; each chunk reads alone, so a reader between two writes loses no more than
    a chunk). A value too long for a chunk of its own is cut."""
    chunks: list[dict[str, str]] = [{}]
    for key in sorted(values):
        value, room = values[key], MAX_TAG_VALUE - len(_json({key: ""}))
        while value and len(_json({key: value})) > MAX_TAG_VALUE:  # escapes: cut again
            value = value[:min(len(value) - 1, room)]
        if len(_json({**chunks[-1], key: value})) > MAX_TAG_VALUE:
            chunks.append({})
        chunks[-1][key] = value
    return [_json(chunk) for chunk in chunks]


def word_chunks(words: list[str]) -> list[str]:
    """Space-separated ``words`` in chunks of at most ``MAX_TAG_VALUE`` characters."""
    chunks = [""]
    for word in words:
        joined = f"{chunks[-1]} {word}" if chunks[-1] else word
        if len(joined) > MAX_TAG_VALUE and chunks[-1]:
            chunks.append(word[:MAX_TAG_VALUE])
        else:
            chunks[-1] = joined[:MAX_TAG_VALUE]
    return chunks if chunks != [""] else []


def _json(values: Mapping[str, str]) -> str:
    return json.dumps(values, separators=(",", ":"), sort_keys=True)


def _chunk_index(stored_key: str, key: str) -> int | None:
    """``0`` for ``key``, ``N`` for ``key.N``, None for any other stored key."""
    if stored_key == key:
        return 0
    head, _, tail = stored_key.rpartition(".")
    return int(tail) if head == key and tail.isdigit() else None


def chunk_keys(stored: Mapping[str, str]) -> set[str]:
    """The stored keys that are chunks of ``run`` or ``segments``."""
    return {k for k in stored if any(_chunk_index(k, key) is not None for key in CHUNKED)}


def decode_tags(stored: Mapping[str, str]) -> dict[str, str]:
    """The inverse of ``encode_tags`` (tolerates stacks without a ``run`` tag, and a chunk
    that does not parse: a reader between two writes)."""
    chunks = chunk_keys(stored)
    tags = {k: v for k, v in stored.items() if k not in chunks}
    for _, text in _chunks_of(stored, RUN_TAG):
        try:
            tags.update(json.loads(text))
        except ValueError:
            pass
    words = " ".join(text for _, text in _chunks_of(stored, SEGMENTS))
    if words:
        tags[SEGMENTS] = words
    return tags


def _chunks_of(stored: Mapping[str, str], key: str) -> list[tuple[int, str]]:
    found = ((_chunk_index(k, key), v) for k, v in stored.items())
    return sorted((index, v) for index, v in found if index is not None)


def with_actor(message: str, actor: str, source: str) -> str:
    """An update's message naming who makes it: ``skyward: pool closed (actor: ana@box,
    self-declared)``; unchanged when it names ``actor`` already (``down --force by ...``)."""
    if actor and actor in message:
        return message
    return f"{message} (actor: {actor}{', ' + source if source == SELF_DECLARED else ''})"


def actor_of(tags: Mapping[str, str]) -> tuple[str, str]:
    """Who ran the pool and how that is known: the authenticated cloud identity, else the
    owner (``user@host``, self-declared)."""
    if tags.get(ACTOR):
        return tags[ACTOR], tags.get(ACTOR_SOURCE) or SELF_DECLARED
    return tags.get("owner", ""), SELF_DECLARED


def ended_value(status: str, actor: str, source: str, via: str, reason: str,
                error: str = "") -> str:
    """The ``ended`` tag: ``{"status": "destroyed" or "destroy failed", "by": actor,
    "source": how the actor is known (``actor_of``), "via": the destroyer (pool, keeper,
    kernel reaper, gc, down), "reason": why[, "error": the failure's class]}``, the reason
    shortened to keep it within ``MAX_TAG_VALUE``."""
    fields = {"status": status, "by": actor, "source": source, "via": via, "reason": reason,
              **({"error": error} if error else {})}

    def text() -> str:
        return json.dumps(fields, separators=(",", ":"))

    while (over := len(text().encode()) - MAX_TAG_VALUE) > 0 and fields["reason"]:
        keep = len(fields["reason"]) - over - 3  # escapes may need another pass
        fields["reason"] = fields["reason"][:keep] + "..." if keep > 0 else ""
    return text()[:MAX_TAG_VALUE]


def ended_of(tags: Mapping[str, str]) -> dict[str, str]:
    """The ``ended`` tag's fields (``ended_value``); empty when a run has none (it is live,
    or ended before the tag existed: its destroy's update message says how)."""
    try:
        fields = json.loads(tags.get(ENDED) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in fields.items()} if isinstance(fields, dict) else {}


def skyward_tags(stored: Mapping[str, str]) -> dict[str, str]:
    """The skyward tags among a stack's stored tags, without their prefix, decoded."""
    return decode_tags(
        {k.removeprefix(TAG_PREFIX): v for k, v in stored.items() if k.startswith(TAG_PREFIX)})
