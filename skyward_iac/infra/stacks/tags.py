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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from skyward_iac.api.deadlines import expires_at, lease_end
from skyward_iac.api.spec import Spec

#: Prefix of every skyward tag in the backend (``skyward:owner``...).
TAG_PREFIX = "skyward:"
#: The prefix of the user's own tags (``Options.tags``) among a stack's tags.
USER_TAG = "tag."
#: Tags ops teams filter on (``pulumi stack ls --tag skyward:owner=...``) and the ones written
#: on their own later (lease renewals, warm, taken down) stay separate; the rest travel in one
#: JSON tag, because every tag written costs one engine command (~0.13 s) on the way up.
SEPARATE_TAGS = ("owner", "provider", "down_by", "warm_until", "lease_until",
                 "plan_expires")
#: Set (to ``user@host``) by whoever destroys a pool's stack from outside it (``skyward-iac
#: down``, gc): the owner, if it still runs, must not bring the nodes back.
DOWN_BY = "down_by"
#: Set while a warm pool's keeper keeps the stack's nodes for their next user (ISO time).
WARM_UNTIL = "warm_until"
RUN_TAG = "run"
#: The prefix of the access log's entries (``infra/stacks/access.py``): each is a tag of its own.
ACCESS = "access."


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


def owner_tags() -> dict[str, str]:
    """Tags that identify this client process to a later collector."""
    return ProcessId.current().tags()


def stack_tags(spec: Spec, node_count: int, now: datetime | None = None,
               usd_per_hour: float = 0.0,
               user_tags: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tags every stack carries, read by ``gc``, ``history`` and ops teams; the user's
    (``Options.tags``) as ``tag.KEY``."""
    now = now or datetime.now(UTC)
    accelerator = spec.accelerator
    return {
        "owner": f"{getpass.getuser()}@{socket.gethostname()}",
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
        **{f"{USER_TAG}{key}": value for key, value in (user_tags or {}).items()},
    }


def encode_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The backend form: separate tags plus one ``run`` tag holding the others as JSON."""
    separate = {k: v for k, v in tags.items() if k in SEPARATE_TAGS or k.startswith(ACCESS)}
    rest = {k: v for k, v in tags.items() if k not in separate}
    return {**separate, RUN_TAG: json.dumps(rest, separators=(",", ":"), sort_keys=True)}


def decode_tags(stored: Mapping[str, str]) -> dict[str, str]:
    """The inverse of ``encode_tags`` (tolerates stacks without a ``run`` tag)."""
    tags = {k: v for k, v in stored.items() if k != RUN_TAG}
    if RUN_TAG in stored:
        try:
            tags.update(json.loads(stored[RUN_TAG]))
        except ValueError:
            pass
    return tags


def skyward_tags(stored: Mapping[str, str]) -> dict[str, str]:
    """The skyward tags among a stack's stored tags, without their prefix, decoded."""
    return decode_tags(
        {k.removeprefix(TAG_PREFIX): v for k, v in stored.items() if k.startswith(TAG_PREFIX)})
