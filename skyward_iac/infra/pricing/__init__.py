"""Rebuilding the offer catalog from the clouds' live pricing APIs (``skyward-iac offers
refresh``): ``aws`` (Price List, spot price history, instance types) and ``gcp`` (Cloud Billing
Catalog). The result has the shipped catalog's format and is stored with its date in
``$SKYWARD_HOME/catalog/<provider>.json``, where ``offers.current_catalog`` finds it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.identity.cloud_credentials import require_credentials
from skyward_iac.infra.pricing.document import RefreshedCatalog
from skyward_iac.infra.pricing.gcp import GcpAuth, refresh_gcp
from skyward_iac.infra.pricing.gcp import gcp_auth as find_gcp_auth

__all__ = ["Refreshed", "RefreshedCatalog", "fetch", "refresh"]


@dataclass(frozen=True, slots=True)
class Refreshed:
    """One provider's refreshed catalog and where it was written."""

    catalog: RefreshedCatalog
    path: Path


def fetch(provider: str, regions: Sequence[str] | None = None,
          gcp_auth: GcpAuth | None = None) -> RefreshedCatalog:
    """Build ``provider``'s catalog from its live APIs without storing it."""
    shipped = offers.packaged_data(provider)
    if provider == "aws":
        require_credentials("aws")
        from skyward_iac.infra.pricing.aws import refresh_aws

        return refresh_aws(shipped, regions)
    return refresh_gcp(shipped, regions, gcp_auth)


def refresh(providers: Sequence[str], regions: Sequence[str] | None = None) -> list[Refreshed]:
    """Fetch every provider's catalog, then store them all. Credentials are checked for all
    providers first; a provider without credentials or without any live price fails before
    anything is written."""
    if "aws" in providers:
        require_credentials("aws")
    auth = find_gcp_auth() if "gcp" in providers else None
    fetched = []
    for provider in providers:
        catalog = fetch(provider, regions, auth)
        if not catalog.data["instances"]:
            raise ConfigError(
                f"the {provider} pricing APIs returned no price for any catalog instance type "
                f"in {', '.join(regions or ['the catalog regions'])}; nothing was written"
            )
        fetched.append(catalog)
    return [Refreshed(c, offers.write_refreshed(c.data)) for c in fetched]
