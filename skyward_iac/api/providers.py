"""Provider configuration objects: where a pool's nodes come from."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from skyward_iac.api.containers import DockerImage, image_reference
from skyward_iac.api.model import UserModel
from skyward_iac.api.storage import GCS_ENDPOINT, StorageEndpoint

if TYPE_CHECKING:
    from skyward_iac.api.spec import Spec

#: A metadata service a node polls for its provider's preemption notice (node/preemption.py).
NoticeSource = Literal["aws", "gcp"]
#: How a node mounts a bucket of its provider's own object store as itself (api/volumes.py).
IdentityMount = Literal["aws-role", "gcp-service-account"]


class _ProviderConfig(UserModel):
    """What every provider takes, and what each declares of itself (class attributes, asked
    instead of comparing ``kind`` wherever the answer is needed; the client side's verbs are in
    ``infra/clouds/``, which the node and api packages cannot import)."""

    #: Nodes are sandboxes on this machine: no offer region, market, cloud-init or metadata.
    on_this_machine: ClassVar[bool] = False
    #: Whose metadata service tells this provider's nodes of a coming preemption; None: none.
    preemption_notice: ClassVar[NoticeSource | None] = None
    #: How its nodes mount a bucket of its own object store as themselves (``mount_kind``);
    #: None: it has no object store, so volumes need keys or a public bucket.
    identity_mount: ClassVar[IdentityMount | None] = None

    #: Run each node's bootstrap and agent inside this image with Docker (host network, the
    #: node's GPUs); None runs them on the node's own OS.
    container_image: DockerImage | None = None

    @field_validator("container_image", mode="before")
    @classmethod
    def _image(cls, value: Any) -> Any:
        return image_reference(value) if isinstance(value, str) else value

    @classmethod
    def owns_store(cls, storage: StorageEndpoint | None) -> bool:
        """Whether ``storage`` (None: no storage named) is this provider's own object store,
        which its nodes reach as themselves (``identity_mount``)."""
        return False

    def check_pool(self, spec: Spec) -> None:
        """Raise ``ValueError`` when ``spec`` asks what this provider cannot give (a ``Spec``
        validator calls it, so the message becomes a ``ConfigError``)."""


class Local(_ProviderConfig):
    """Nodes on this machine: each one a sandbox with its own loopback address and a real sshd.

    Used for development, tests and CI: the same stack, SSH, bootstrap and agent path as a cloud.
    ``usd_per_hour`` prices each node as if it were a cloud's (default 0: free), so costs,
    ``Options(max_cost_usd)`` budgets and the cost policy rules can be tried on this machine.
    ``first_contact_grace`` is how long a new node waits for its client's first heartbeat
    (at least its ttl) before it stops itself.
    """

    kind: Literal["local"] = "local"
    on_this_machine: ClassVar[bool] = True
    usd_per_hour: float = Field(
        default=0.0, ge=0, allow_inf_nan=False,
        description="what one node counts as costing, in USD per hour (a pretend price for "
                    "tests, demos and docs; 0: free)")
    first_contact_grace: float = Field(
        default=30.0, ge=1, le=3600, allow_inf_nan=False,
        description="seconds a new node waits for its client's first heartbeat (or its ttl, "
                    "if longer) before it stops itself: the rest of the ``up`` and the first "
                    "SSH contact; a client killed during ``up`` leaves nodes that live this long")

    def check_pool(self, spec: Spec) -> None:
        if spec.accelerator is not None:
            raise ValueError(
                f"Local nodes have no accelerator: they are processes on this machine, so "
                f"accelerator={spec.accelerator.name} cannot be honoured; drop it for Local, or "
                "use sky.AWS()/sky.GCP() (a list of Specs falls back from one to the next)"
            )
        if self.container_image is not None and spec.volumes:
            raise ValueError(
                "a Local node mounts its volumes in a mount namespace of its own, which a "
                "Docker container cannot see: use container_image or volumes on Local, not both"
            )


class AWS(_ProviderConfig):
    """Amazon EC2 nodes, provisioned with pulumi-aws."""

    kind: Literal["aws"] = "aws"
    preemption_notice: ClassVar[NoticeSource | None] = "aws"
    identity_mount: ClassVar[IdentityMount | None] = "aws-role"
    region: str | None = None
    use_default_vpc: bool = True
    ssh_cidr: str | None = Field(
        default=None, description="CIDR allowed to reach SSH; defaults to the caller's public /32"
    )

    @classmethod
    def owns_store(cls, storage: StorageEndpoint | None) -> bool:
        """S3 itself (its instance profile signs), not an S3-compatible vendor."""
        return storage is None or is_aws_s3(storage)


#: An email GCP gives a service account (user-managed, or one of Google's).
GCP_ACCOUNT_EMAIL = re.compile(r"[a-z0-9][-a-z0-9.]*@[-a-z0-9.]+\.gserviceaccount\.com")


class GCP(_ProviderConfig):
    """Google Compute Engine nodes, provisioned with pulumi-gcp."""

    kind: Literal["gcp"] = "gcp"
    preemption_notice: ClassVar[NoticeSource | None] = "gcp"
    identity_mount: ClassVar[IdentityMount | None] = "gcp-service-account"
    project: str | None = None
    region: str | None = None
    zone: str | None = None
    ssh_cidr: str | None = None
    service_account: str | None = Field(
        default="auto",
        description="what the nodes run as: 'auto' (a service account of the stack's own when "
                    "they need one, none where GCP refuses to create it), an existing "
                    "account's email, or None / 'none' (no account: a silent node stops "
                    "instead of deleting itself; no bucket volumes)")

    @field_validator("service_account")
    @classmethod
    def _account(cls, value: str | None) -> str | None:
        if value is None or value == "none":  # 'none': config files have no null
            return None
        if value == "auto" or GCP_ACCOUNT_EMAIL.fullmatch(value):
            return value
        raise ValueError("must be 'auto', None ('none') or a service account's email "
                         f"(NAME@PROJECT.iam.gserviceaccount.com), got {value!r}")

    @classmethod
    def owns_store(cls, storage: StorageEndpoint | None) -> bool:
        """GCS (its service account's token signs)."""
        return storage is None or storage.endpoint.rstrip("/") == GCS_ENDPOINT


def is_aws_s3(storage: StorageEndpoint) -> bool:
    """Whether ``storage`` is Amazon S3 itself (not an S3-compatible vendor)."""
    host = storage.endpoint.split("://", 1)[-1].split("/", 1)[0]
    return host.endswith(".amazonaws.com") and host.startswith("s3")


ProviderConfig = Local | AWS | GCP
#: Each provider's spec class by its ``kind``.
PROVIDER_CLASSES: dict[str, type[Local | AWS | GCP]] = {
    c.model_fields["kind"].default: c for c in (Local, AWS, GCP)}


def provider_class(kind: str) -> type[Local | AWS | GCP]:
    """The spec class of provider ``kind`` (``"local"``, ``"aws"``, ``"gcp"``)."""
    try:
        return PROVIDER_CLASSES[kind]
    except KeyError:
        raise ValueError(f"provider must be one of {', '.join(PROVIDER_CLASSES)}, "
                         f"got {kind!r}") from None
