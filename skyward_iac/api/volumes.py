"""``Volume``: a bucket mounted as a directory on every node of a pool (FUSE).

    sky.Volume(bucket="datasets", mount="/data")                          # read-only
    sky.Volume(bucket="runs", mount="/ckpt", prefix="exp1", read_only=False,
               storage=sky.storage.R2(account_id=..., access_key=..., secret_key=...))

How a node reaches the bucket (``mount_kind``) follows from the provider and the storage:
AWS nodes without keys use the instance profile the stack creates, GCP nodes without keys the
service account the stack creates, and any storage with keys is mounted with those keys (which
travel as Pulumi secrets and land in 0600 files on the node, never on a command line).
"""

from __future__ import annotations

import itertools
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import field_validator

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.model import UserModel
from skyward_iac.api.providers import IdentityMount, provider_class
from skyward_iac.api.storage import StorageEndpoint

#: Paths a volume may not be mounted on (or, for the last group, under): mounting there would
#: hide the node's own system, the skyward workdir, or the temporary directory tasks rely on.
FORBIDDEN_MOUNTS = ("/", "/opt", "/opt/skyward", "/root", "/tmp")
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/opt/skyward",
                "/proc", "/run", "/sbin", "/sys", "/usr", "/var")
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")

#: How a node mounts a volume: the AWS instance profile, the GCP service account, the storage's
#: keys, or anonymously (public buckets, read-only).
MountKind = Literal[IdentityMount, "s3-keys", "s3-public"]
ProviderKind = Literal["local", "aws", "gcp"]


class Volume(UserModel):
    """A bucket (optionally one ``prefix`` of it) mounted at ``mount`` on every node.

    ``read_only`` volumes refuse writes in the kernel (EROFS). ``storage`` says where the
    bucket lives; None means the provider's own store (S3 on AWS, GCS on GCP).
    """

    positional = ("bucket", "mount", "prefix", "read_only", "storage")

    bucket: str
    mount: str
    prefix: str = ""
    read_only: bool = True
    storage: StorageEndpoint | None = None

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, value: str) -> str:
        if not BUCKET_NAME.match(value) or ".." in value:
            raise ValueError(f"bucket must be a bucket name such as 'my-data' (lowercase "
                             f"letters, digits, '.', '-', '_'; 3-222 chars), got {value!r}")
        return value

    @field_validator("mount")
    @classmethod
    def _mount(cls, value: str) -> str:
        return check_mount(value)

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        cleaned = value.strip("/")
        if any(part in ("", ".", "..") for part in cleaned.split("/")) and cleaned:
            raise ValueError(f"prefix must be a path inside the bucket like 'runs/exp1', "
                             f"got {value!r}")
        return cleaned


def check_mount(mount: str) -> str:
    """``mount`` normalized (``/data/`` -> ``/data``), or a ValueError saying why not."""
    if not mount.startswith("/"):
        raise ValueError(f"mount must be an absolute path like '/data', got {mount!r}")
    if any(part in (".", "..") for part in mount.split("/")):
        raise ValueError(f"mount must not contain '.' or '..', got {mount!r}")
    path = posixpath.normpath(mount)
    path = "/" + path.lstrip("/")  # normpath keeps a leading '//'
    if path in FORBIDDEN_MOUNTS:
        raise ValueError(f"mount {path!r} is reserved (not allowed: "
                         f"{', '.join(FORBIDDEN_MOUNTS)}); use a directory like '/data'")
    for tree in SYSTEM_TREES:
        if path == tree or path.startswith(tree + "/"):
            raise ValueError(f"mount {path!r} would hide the node's {tree}; use a directory "
                             "like '/data' or '/mnt/data'")
    if not re.fullmatch(r"[A-Za-z0-9._/@+-]+", path):
        raise ValueError(f"mount may use letters, digits and . _ - @ + only, got {mount!r}")
    return path


def mount_kind(volume: Volume, provider: str) -> MountKind:
    """How nodes of ``provider`` mount ``volume``; a ConfigError when they cannot.

    Storage with keys always mounts with the keys. Without keys: AWS nodes reach S3 through
    their instance profile, GCP nodes reach GCS through their service account, and anything
    else is mounted anonymously, which only a read-only volume of a public bucket can be.
    """
    storage = volume.storage
    if storage is not None and storage.access_key is not None:
        return "s3-keys"
    own = provider_class(provider)
    if own.identity_mount is not None and own.owns_store(storage):
        return own.identity_mount
    if storage is None:
        raise ConfigError(
            f"volume {volume.mount}: a {provider} pool has no object store of its own; pass "
            "storage=sky.Storage(endpoint=..., access_key=..., secret_key=...) or a preset "
            "such as sky.storage.R2(...)")
    if not volume.read_only:
        raise ConfigError(
            f"volume {volume.mount}: bucket {volume.bucket!r} at {storage.endpoint} has no "
            f"keys, so {provider} nodes could only mount it anonymously, which is read-only; "
            "give the storage access_key/secret_key or set read_only=True")
    return "s3-public"


def check_volumes(volumes: Sequence[Volume], provider: str) -> None:
    """Refuse, before provisioning, volumes that nodes of ``provider`` could not mount.

    Every volume needs a usable ``mount_kind``; no two volumes may share a mount point or be
    mounted one inside another (the outer mount would hide or be hidden by the inner one).
    """
    for volume in volumes:
        mount_kind(volume, provider)
    mounts = sorted(v.mount for v in volumes)
    for outer, inner in itertools.pairwise(mounts):
        if inner == outer or inner.startswith(outer + "/"):
            raise ConfigError(f"volumes mount {outer!r} and {inner!r}: each volume needs a "
                              "mount point of its own, not inside another")


@dataclass(frozen=True, slots=True)
class VolumeKeys:
    """One volume's resolved keys; the secret never reaches a repr or a log line."""

    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)

    def __repr__(self) -> str:
        return "VolumeKeys(***)"


def volume_keys(volumes: Sequence[Volume], provider: str) -> dict[int, VolumeKeys]:
    """Resolve the keys of every ``s3-keys`` volume, by index (calls key functions once).

    Run on the client before ``up``; the result goes into the stack as a Pulumi secret.
    """
    resolved: dict[int, VolumeKeys] = {}
    cache: dict[int, tuple[str, str] | None] = {}
    for index, volume in enumerate(volumes):
        if volume.storage is None or mount_kind(volume, provider) != "s3-keys":
            continue
        # Volumes sharing one Storage share its keys (and call its functions once).
        ident = id(volume.storage)
        if ident not in cache:
            cache[ident] = volume.storage.keys()
        pair = cache[ident]
        if pair is None:
            raise ConfigError(f"volume {volume.mount}: its storage resolved no keys")
        resolved[index] = VolumeKeys(*pair)
    return resolved


def keys_from_outputs(value: Mapping[str, Any] | None) -> dict[int, VolumeKeys]:
    """Read the stack's ``volume_keys`` output (``{"0": {access_key, secret_key}}``) back."""
    return {int(index): VolumeKeys(str(pair["access_key"]), str(pair["secret_key"]))
            for index, pair in (value or {}).items()}


def keys_for_outputs(keys: Mapping[int, VolumeKeys]) -> dict[str, dict[str, str]]:
    """``keys`` in the shape of the ``volume_keys`` stack output (string indexes)."""
    return {str(index): {"access_key": pair.access_key, "secret_key": pair.secret_key}
            for index, pair in sorted(keys.items())}
