"""AWS: EC2 nodes (``programs/aws.py``), pinned to the account the stack was created in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from skyward_iac.infra.clouds.base import Cloud
from skyward_iac.infra.identity import cloud_credentials
from skyward_iac.infra.programs import pins
from skyward_iac.node.data_port import CLOUD_BIND

if TYPE_CHECKING:
    from skyward_iac.infra.pricing.document import RefreshedCatalog
    from skyward_iac.infra.programs import ClusterRequest
    from skyward_iac.infra.programs.pins import Resolvers


class AwsCloud(Cloud):
    kind: ClassVar[str] = "aws"
    credential_sources: ClassVar[tuple[str, ...]] = cloud_credentials.AWS_SOURCES
    pin_keys: ClassVar[tuple[str, ...]] = (pins.SSH_CIDR, pins.AWS_ACCOUNT_ID, *pins.DECIDED)
    actor_costs_a_call: ClassVar[bool] = True

    def program(self, request: ClusterRequest) -> Callable[[], None]:
        from skyward_iac.infra.programs.aws import aws_program

        return aws_program(request)

    def data_bind(self, private_address: str) -> str | None:
        """Every interface on the fixed ``CLOUD_PORT``, which the stack's security group opens
        to the SSH source ranges alone (``common.ingress_rules``)."""
        return CLOUD_BIND

    def stack_pins(self, request: ClusterRequest, resolvers: Resolvers) -> dict[str, str]:
        return pins.aws_pins(request, resolvers)

    def credential_source(self) -> str | None:
        return cloud_credentials.aws_credential_source()

    def find_actor(self) -> tuple[str, str] | None:
        """The caller ARN STS names (asked once per process)."""
        from skyward_iac.infra.identity import cloud_identity

        return cloud_identity.aws_caller()

    def pricing_auth(self) -> Any:
        """boto3's own credentials: checked here, so no catalog is fetched without them."""
        cloud_credentials.require_credentials(self.kind)
        return None

    def fetch_catalog(self, shipped: dict[str, Any], regions: Sequence[str] | None,
                      auth: Any) -> RefreshedCatalog:
        """Price List, spot price history and instance types (``pricing/aws.py``)."""
        from skyward_iac.infra.pricing.aws import refresh_aws

        return refresh_aws(shipped, regions)

    def nodes_move_alone(self, request: ClusterRequest) -> bool:
        """A cluster placement group (and with it an EFA pool) lives in one zone."""
        from skyward_iac.infra.programs import common

        return not common.plan_cluster(request).placement


AWS = AwsCloud()
