"""Rebuilding the offer catalog from the clouds' live pricing APIs (``skyward-iac offers
refresh``): ``aws`` (Price List, spot price history, instance types) and ``gcp`` (Cloud Billing
Catalog). The result has the shipped catalog's format and is stored with its date in
``$SKYWARD_HOME/catalog/<provider>.json``, where ``offers.current_catalog`` finds it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.clouds import cloud
from skyward_iac.infra.pricing.document import RefreshedCatalog

__all__ = ["Refreshed", "RefreshedCatalog", "fetch", "refresh"]


@dataclass(frozen=True, slots=True)
class Refreshed:
    """One provider's refreshed catalog and where it was written."""

    catalog: RefreshedCatalog
    path: Path


def fetch(provider: str, regions: Sequence[str] | None = None,
          auth: Any = None) -> RefreshedCatalog:
    """Build ``provider``'s catalog from its live APIs without storing it (``auth``: what
    ``Cloud.pricing_auth`` found, found now when not given)."""
    shipped = offers.packaged_data(provider)
    provider_cloud = cloud(provider)
    if auth is None:
        auth = provider_cloud.pricing_auth()
    return provider_cloud.fetch_catalog(shipped, regions, auth)


def refresh(providers: Sequence[str], regions: Sequence[str] | None = None) -> list[Refreshed]:
    """Fetch every provider's catalog, then store them all. Credentials are checked for all
    providers first; a provider without credentials or without any live price fails before
    anything is written."""
    auths = {provider: cloud(provider).pricing_auth() for provider in providers}
    fetched = []
    for provider in providers:
        catalog = fetch(provider, regions, auths[provider])
        if not catalog.data["instances"]:
            raise ConfigError(
                f"the {provider} pricing APIs returned no price for any catalog instance type "
                f"in {', '.join(regions or ['the catalog regions'])}; nothing was written"
            )
        fetched.append(catalog)
    return [Refreshed(c, offers.write_refreshed(c.data)) for c in fetched]
