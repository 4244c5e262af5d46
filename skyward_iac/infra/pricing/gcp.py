"""Live GCP prices from the Cloud Billing Catalog API (the Compute Engine service's SKUs).

GCP bills a VM as its parts: vCPU-hours and GiB-hours of the machine family, plus each GPU;
spot parts are separate SKUs (usage type ``Preemptible``). A catalog row's price is rebuilt
from those parts, for the row's vCPUs, memory and accelerators, in each region.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.pricing.document import Prices, RefreshedCatalog, build

COMPUTE_ENGINE = "6F81-5844-456A"  # the Compute Engine service in the billing catalog
ENDPOINT = "https://cloudbilling.googleapis.com"
#: Another endpoint for the billing API (a proxy, or a test server).
ENDPOINT_ENV = "SKYWARD_GCP_BILLING_ENDPOINT"
SOURCE = ("live: Google Cloud Billing Catalog API (Compute Engine SKUs: the machine family's "
          "vCPU and RAM prices times the row's vCPUs and GiB, plus its GPUs; Spot Preemptible "
          "SKUs for spot)")
MARKETS = {"OnDemand": "on_demand", "Preemptible": "spot"}
_PLACE = r"running in [A-Za-z .]+$"  # a region or multi-region; suffixed variants are others
CORE_SKU = re.compile(rf"^(?:Spot )?(?:Preemptible )?(?P<what>.+?) Instance (?P<part>Core|Ram) "
                      rf"{_PLACE}")
GPU_SKU = re.compile(rf"^(?:Spot )?(?:Preemptible )?Nvidia (?:Tesla )?(?P<gpu>.+?) GPU"
                     rf"(?: attached to .+?)? {_PLACE}")
_NOT_FAMILY = {"predefined", "arm", "amd", "intel"}

PriceKey = tuple[str, str, str, str]  # (family or GPU, "core" | "ram" | "gpu", market, region)


@dataclass(frozen=True, slots=True)
class GcpAuth:
    """The HTTP header that authenticates catalog requests, and where it came from."""

    header: tuple[str, str]
    source: str

    def __repr__(self) -> str:  # the token never reaches a log line
        return f"GcpAuth(source={self.source!r})"


def gcp_auth() -> GcpAuth:
    """``GOOGLE_OAUTH_ACCESS_TOKEN``, else ``GOOGLE_API_KEY``, else ``gcloud auth
    print-access-token``; ``ConfigError`` naming them when none works."""
    if token := os.environ.get("GOOGLE_OAUTH_ACCESS_TOKEN"):
        return GcpAuth(("Authorization", f"Bearer {token}"), "GOOGLE_OAUTH_ACCESS_TOKEN")
    if key := os.environ.get("GOOGLE_API_KEY"):
        return GcpAuth(("x-goog-api-key", key), "GOOGLE_API_KEY")
    if gcloud := shutil.which("gcloud"):
        done = subprocess.run([gcloud, "auth", "print-access-token"], capture_output=True,
                              text=True, timeout=60, check=False)
        if done.returncode == 0 and done.stdout.strip():
            return GcpAuth(("Authorization", f"Bearer {done.stdout.strip()}"), "gcloud")
    raise ConfigError(
        "no GCP credentials for the Cloud Billing Catalog API: set GOOGLE_OAUTH_ACCESS_TOKEN "
        "(e.g. to `gcloud auth print-access-token`), or GOOGLE_API_KEY (an API key of a project "
        "with the Cloud Billing API enabled), or log in with `gcloud auth login`"
    )


def fetch_skus(auth: GcpAuth, endpoint: str | None = None,
               timeout: float = 60.0) -> Iterator[dict[str, Any]]:
    """Every Compute Engine SKU, page by page (``nextPageToken``), prices in USD."""
    base = (endpoint or os.environ.get(ENDPOINT_ENV) or ENDPOINT).rstrip("/")
    token = ""
    while True:
        query = urllib.parse.urlencode({"currencyCode": "USD", "pageSize": 5000,
                                        **({"pageToken": token} if token else {})})
        url = f"{base}/v1/services/{COMPUTE_ENGINE}/skus?{query}"
        request = urllib.request.Request(url, headers=dict([auth.header]))
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
                page = json.load(response)
        except urllib.error.HTTPError as exc:
            raise ConfigError(f"the Cloud Billing Catalog API refused the request ({exc.code}: "
                              f"{_api_message(exc)}; credentials from {auth.source})") from None
        except OSError as exc:
            raise ConfigError(f"could not reach the Cloud Billing Catalog API at {base}: "
                              f"{exc}") from None
        yield from page.get("skus", [])
        token = page.get("nextPageToken", "")
        if not token:
            return


def _api_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"]["message"])
    except (ValueError, KeyError, TypeError, OSError):
        return exc.reason or "no detail"


def unit_price(sku: dict[str, Any]) -> float | None:
    """USD per unit of the SKU's current base tier."""
    for info in sku.get("pricingInfo", [])[-1:]:
        rates = sorted(info["pricingExpression"]["tieredRates"],
                       key=lambda r: r.get("startUsageAmount", 0))
        if rates:
            money = rates[0]["unitPrice"]
            return int(money.get("units", 0) or 0) + money.get("nanos", 0) / 1e9
    return None


def family_key(what: str) -> str:
    """"N1 Predefined" -> "n1", "T2A Arm" -> "t2a", "A2 Ultra" -> "a2 ultra"."""
    return " ".join(w for w in what.lower().split() if w not in _NOT_FAMILY)


def index_skus(skus: Iterable[dict[str, Any]]) -> dict[PriceKey, float]:
    """Hourly unit prices by (family or GPU, part, market, region)."""
    index: dict[PriceKey, float] = {}
    for sku in skus:
        market = MARKETS.get(sku.get("category", {}).get("usageType", ""))
        description = sku.get("description", "")
        if market is None:
            continue
        if core := CORE_SKU.match(description):
            name, part = family_key(core["what"]), core["part"].lower()
        elif gpu := GPU_SKU.match(description):
            name, part = gpu["gpu"].lower(), "gpu"
        else:
            continue
        price = unit_price(sku)
        if price is None:
            continue
        for region in sku.get("serviceRegions", []):
            key = (name, part, market, region)
            index[key] = min(price, index.get(key, price))
    return index


def family_candidates(machine_type: str) -> list[str]:
    """SKU family names for a machine type, most specific first: a2-ultragpu-1g ->
    ["a2 ultra", "a2"]."""
    parts = machine_type.split("-")
    variant = parts[1].removesuffix("gpu") if len(parts) > 2 else ""
    return [f"{parts[0]} {variant}", parts[0]] if variant else [parts[0]]


def gpu_candidates(accelerator: dict[str, Any]) -> list[str]:
    """SKU GPU names for a catalog accelerator: A100 80GB -> ["a100 80gb", "a100"]."""
    name = str(accelerator["name"]).lower()
    memory = accelerator.get("memory_gb")
    return [f"{name} {memory:g}gb", name] if memory else [name]


def _lookup(index: dict[PriceKey, float], names: Sequence[str], part: str, market: str,
            region: str) -> float | None:
    return next((index[k] for n in names if (k := (n, part, market, region)) in index), None)


def row_prices(index: dict[PriceKey, float], row: dict[str, Any], region: str) -> Prices:
    """A catalog region entry for ``row``: on-demand and spot USD/hour, None where a part
    (core, RAM or GPU) has no SKU."""
    families = family_candidates(row.get("machine_type", row["instance_type"]))
    accelerator = row.get("accelerator")
    prices: Prices = {}
    for market in MARKETS.values():
        core = _lookup(index, families, "core", market, region)
        ram = _lookup(index, families, "ram", market, region)
        gpu = _lookup(index, gpu_candidates(accelerator), "gpu", market, region) \
            if accelerator else 0.0
        if core is None or ram is None or gpu is None:
            prices[market] = None
            continue
        gpus = accelerator["count"] if accelerator else 0
        prices[market] = round(row["vcpus"] * core + row["memory_gb"] * ram + gpus * gpu, 6)
    return prices


def refresh_gcp(shipped: dict[str, Any], regions: Sequence[str] | None = None,
                auth: GcpAuth | None = None, endpoint: str | None = None) -> RefreshedCatalog:
    """The shipped GCP catalog's machine types priced live in ``regions`` (default: the
    regions each is listed in)."""
    index = index_skus(fetch_skus(auth or gcp_auth(), endpoint))
    return build(shipped, regions, SOURCE, lambda row, region: row_prices(index, row, region))
