"""GCP: Compute Engine nodes (``programs/gcp.py``), in the project the stack was created in."""

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


class GcpCloud(Cloud):
    kind: ClassVar[str] = "gcp"
    credential_sources: ClassVar[tuple[str, ...]] = cloud_credentials.GCP_SOURCES
    pin_keys: ClassVar[tuple[str, ...]] = (pins.SSH_CIDR, pins.GCP_PROJECT, *pins.DECIDED,
                                           pins.IDENTITY)

    def program(self, request: ClusterRequest) -> Callable[[], None]:
        from skyward_iac.infra.programs.gcp import gcp_program

        return gcp_program(request)

    def data_bind(self, private_address: str) -> str | None:
        """Every interface on the fixed ``CLOUD_PORT``, which the stack's firewall opens
        to the SSH source ranges alone (``common.ingress_rules``)."""
        return CLOUD_BIND

    def stack_pins(self, request: ClusterRequest, resolvers: Resolvers) -> dict[str, str]:
        return pins.gcp_pins(request, resolvers)

    def credential_source(self) -> str | None:
        return cloud_credentials.gcp_credential_source()

    def find_actor(self) -> tuple[str, str] | None:
        """The account of its credentials: a key's ``client_email``, else gcloud's account."""
        from skyward_iac.infra.identity import cloud_identity

        return cloud_identity.gcp_account()

    def pricing_auth(self) -> Any:
        """The Cloud Billing Catalog's token (``pricing/gcp.py``), found once for all regions."""
        from skyward_iac.infra.pricing.gcp import gcp_auth

        return gcp_auth()

    def fetch_catalog(self, shipped: dict[str, Any], regions: Sequence[str] | None,
                      auth: Any) -> RefreshedCatalog:
        """The Cloud Billing Catalog's SKUs (``pricing/gcp.py``)."""
        from skyward_iac.infra.pricing.gcp import refresh_gcp

        return refresh_gcp(shipped, regions, auth)

    def nodes_move_alone(self, request: ClusterRequest) -> bool:
        """A compact placement policy holds its VMs in one zone, and a zone the user set
        (``sky.GCP(zone=...)``) stays; otherwise the subnetwork spans the region, so a node may
        run in any of its zones."""
        from skyward_iac.infra.programs import common
        from skyward_iac.infra.programs.gcp import compact_placement

        if getattr(request.spec.provider, "zone", None):
            return False
        return not compact_placement(common.plan_cluster(request))


GCP = GcpCloud()
