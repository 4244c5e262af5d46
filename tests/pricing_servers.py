"""Local servers that speak the cloud pricing APIs for the catalog refresh tests.

EC2 (instance types, offerings, spot price history) is moto's real server. moto has no Price
List API and Google's billing catalog has no emulator, so two tiny HTTP servers answer those
with the real APIs' JSON shapes and pagination tokens, from figures a test chooses.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

Handler = Callable[[BaseHTTPRequestHandler, bytes], tuple[int, dict[str, Any]]]


@contextmanager
def json_server(handle: Handler) -> Iterator[str]:
    """A loopback HTTP server answering every GET/POST with ``handle``'s (status, JSON)."""

    class Answer(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, payload = handle(self, body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -- AWS Price List (awsJson1_1, X-Amz-Target: AWSPriceListService.GetProducts) -----------------


def price_list_product(instance_type: str, region: str, usd: float,
                       **attributes: str) -> dict[str, Any]:
    """One EC2 product as the Price List API returns it (attributes, OnDemand terms)."""
    sku = f"SKU{abs(hash((instance_type, region, usd))) % 10**8}"
    attrs = {"instanceType": instance_type, "regionCode": region, "operatingSystem": "Linux",
             "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
             "operation": "RunInstances", **attributes}
    return {
        "product": {"productFamily": "Compute Instance", "sku": sku, "attributes": attrs},
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {"priceDimensions": {
            f"{sku}.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "description": "per hour",
                                              "pricePerUnit": {"USD": f"{usd:.10f}"}}}}}},
        "serviceCode": "AmazonEC2",
    }


@dataclass
class PriceListApi:
    """The products it sells, and every request it was sent."""

    products: list[dict[str, Any]]
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, Any]]:
        target = handler.headers.get("X-Amz-Target", "")
        if target != "AWSPriceListService.GetProducts":
            return 400, {"__type": "UnknownOperationException", "message": target}
        request = json.loads(body)
        self.requests.append(request)
        wanted = {f["Field"]: f["Value"] for f in request.get("Filters", [])}
        matches = [p for p in self.products
                   if all(p["product"]["attributes"].get(k) == v for k, v in wanted.items())]
        start = int(request.get("NextToken") or 0)
        page: dict[str, Any] = {"FormatVersion": "aws_v1",
                                "PriceList": [json.dumps(p) for p in matches[start:start + 1]]}
        if start + 1 < len(matches):  # one product per page: the client must follow NextToken
            page["NextToken"] = str(start + 1)
        return 200, page


# -- Google Cloud Billing Catalog (GET /v1/services/{service}/skus) ----------------------------


def billing_sku(description: str, usage: str, regions: list[str], usd: float,
                unit: str = "h") -> dict[str, Any]:
    """One SKU as the Cloud Billing Catalog API returns it."""
    units, nanos = divmod(round(usd * 1e9), 10**9)
    return {
        "name": f"services/6F81-5844-456A/skus/{abs(hash(description + usage)) % 10**8}",
        "description": description,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                     "resourceGroup": "CPU", "usageType": usage},
        "serviceRegions": regions,
        "pricingInfo": [{"pricingExpression": {
            "usageUnit": unit, "displayQuantity": 1,
            "tieredRates": [{"startUsageAmount": 0,
                             "unitPrice": {"currencyCode": "USD", "units": str(units),
                                           "nanos": nanos}}]}}],
    }


@dataclass
class BillingCatalogApi:
    """Serves ``skus`` ``page_size`` per page; accepts only ``token`` (Bearer) or ``key``."""

    skus: list[dict[str, Any]]
    token: str = "test-token"
    key: str = "test-key"
    page_size: int = 2
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def __call__(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, Any]]:
        url = urlparse(handler.path)
        self.requests.append((handler.path, dict(handler.headers)))
        if (handler.headers.get("Authorization") != f"Bearer {self.token}"
                and handler.headers.get("x-goog-api-key") != self.key):
            return 401, {"error": {"code": 401, "message": "Request had invalid authentication "
                                   "credentials.", "status": "UNAUTHENTICATED"}}
        if url.path != "/v1/services/6F81-5844-456A/skus":
            return 404, {"error": {"code": 404, "message": "unknown service"}}
        start = int(parse_qs(url.query).get("pageToken", ["0"])[0])
        page: dict[str, Any] = {"skus": self.skus[start:start + self.page_size]}
        if start + self.page_size < len(self.skus):
            page["nextPageToken"] = str(start + self.page_size)
        return 200, page
