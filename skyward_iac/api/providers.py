"""Provider configuration objects: where a pool's nodes come from."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from skyward_iac.api.model import UserModel


class _ProviderConfig(UserModel):
    pass


class Local(_ProviderConfig):
    """Nodes on this machine: each one a sandbox with its own loopback address and a real sshd.

    Used for development, tests and CI: the same stack, SSH, bootstrap and agent path as a cloud.
    """

    kind: Literal["local"] = "local"


class AWS(_ProviderConfig):
    """Amazon EC2 nodes, provisioned with pulumi-aws."""

    kind: Literal["aws"] = "aws"
    region: str | None = None
    use_default_vpc: bool = True
    ssh_cidr: str | None = Field(
        default=None, description="CIDR allowed to reach SSH; defaults to the caller's public /32"
    )


class GCP(_ProviderConfig):
    """Google Compute Engine nodes, provisioned with pulumi-gcp."""

    kind: Literal["gcp"] = "gcp"
    project: str | None = None
    region: str | None = None
    zone: str | None = None
    ssh_cidr: str | None = None


ProviderConfig = Local | AWS | GCP
