"""Provider configuration objects: where a pool's nodes come from."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from skyward_iac.api.containers import DockerImage, image_reference
from skyward_iac.api.model import UserModel


class _ProviderConfig(UserModel):
    #: Run each node's bootstrap and agent inside this image with Docker (host network, the
    #: node's GPUs); None runs them on the node's own OS.
    container_image: DockerImage | None = None

    @field_validator("container_image", mode="before")
    @classmethod
    def _image(cls, value: Any) -> Any:
        return image_reference(value) if isinstance(value, str) else value


class Local(_ProviderConfig):
    """Nodes on this machine: each one a sandbox with its own loopback address and a real sshd.

    Used for development, tests and CI: the same stack, SSH, bootstrap and agent path as a cloud.
    ``usd_per_hour`` prices each node as if it were a cloud's (default 0: free), so costs,
    ``Options(max_cost_usd)`` budgets and the cost policy rules can be tried on this machine.
    """

    kind: Literal["local"] = "local"
    usd_per_hour: float = Field(
        default=0.0, ge=0, allow_inf_nan=False,
        description="what one node counts as costing, in USD per hour (a pretend price for "
                    "tests, demos and docs; 0: free)")


class AWS(_ProviderConfig):
    """Amazon EC2 nodes, provisioned with pulumi-aws."""

    kind: Literal["aws"] = "aws"
    region: str | None = None
    use_default_vpc: bool = True
    ssh_cidr: str | None = Field(
        default=None, description="CIDR allowed to reach SSH; defaults to the caller's public /32"
    )


#: An email GCP gives a service account (user-managed, or one of Google's).
GCP_ACCOUNT_EMAIL = re.compile(r"[a-z0-9][-a-z0-9.]*@[-a-z0-9.]+\.gserviceaccount\.com")


class GCP(_ProviderConfig):
    """Google Compute Engine nodes, provisioned with pulumi-gcp."""

    kind: Literal["gcp"] = "gcp"
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


ProviderConfig = Local | AWS | GCP
