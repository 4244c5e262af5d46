"""Where a collection's data lives in etcd, and how values and keys become bytes.

Every key is ``/skyward/<job_id>/<kind>/<name>/<item>``: the job id keeps two pools (or two
runs against the same etcd) apart, the kind keeps ``dict("x")`` and ``set("x")`` apart, and each
path segment is percent-encoded so no user name can reach into another collection's prefix.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import cloudpickle

from skyward_iac.api.errors import ConfigError

ROOT = "/skyward"


@dataclass(frozen=True, slots=True)
class Namespace:
    """The key space of one job: ``/skyward/<job_id>/``."""

    job_id: str

    def __post_init__(self) -> None:
        if not self.job_id or "/" in self.job_id or not self.job_id.isprintable():
            raise ConfigError(
                f"job id {self.job_id!r} cannot name a collections namespace: use a non-empty "
                "printable id without '/' (the stack name works)"
            )

    @property
    def prefix(self) -> str:
        """Every key of this job starts with it."""
        return f"{ROOT}/{_segment(self.job_id)}/"

    def collection(self, kind: str, name: str) -> str:
        """The prefix of one collection, ending in ``/`` so ``a`` never matches ``ab``."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a collection name must be a non-empty string, not {name!r}")
        return f"{self.prefix}{kind}/{_segment(name)}/"


def item_key(value: Any) -> str:
    """The etcd key segment naming a dict key or set member.

    Strings and ints stay readable (``s:…``, ``i:…``) for anyone browsing with etcdctl; any
    other value is named by the SHA-256 of its pickle. Keys therefore compare by type and value:
    ``1``, ``1.0`` and ``True`` are three different keys.
    """
    if type(value) is str:
        return "s:" + _segment(value)
    if type(value) is int:
        return f"i:{value}"
    try:
        data = pickle.dumps(value, protocol=5)
    except (pickle.PicklingError, TypeError, AttributeError):
        data = cloudpickle.dumps(value, protocol=5)
    return "h:" + hashlib.sha256(data).hexdigest()


def encode_value(value: Any) -> bytes:
    """Serialize a user value (cloudpickle, so lambdas and local classes work)."""
    data: bytes = cloudpickle.dumps(value, protocol=5)
    return data


def decode_value(data: bytes) -> Any:
    """Rebuild a value written by :func:`encode_value`."""
    return cloudpickle.loads(data)


def _segment(text: str) -> str:
    return quote(text, safe="")
