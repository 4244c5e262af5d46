"""``sky.storage``: ``Storage`` presets for well-known object stores, with their real endpoints.

    sky.storage.S3(region="eu-west-1")
    sky.storage.R2(account_id="...", access_key="...", secret_key="...")

Every preset returns a plain ``Storage``; keys may be strings or functions returning (or
awaiting) them, resolved only when a client opens or a pool mounts a volume.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

from skyward_iac.api.errors import ConfigError, StorageError
from skyward_iac.api.storage import GCS_ENDPOINT, Credential
from skyward_iac.storage.client import Storage

__all__ = ["GCS", "R2", "S3", "Backblaze", "Credential", "Hyperstack", "Storage", "Wasabi"]

HYPERSTACK_API = "https://infrahub-api.nexgencloud.com/v1"
#: Hyperstack's S3 endpoint per object-storage region.
HYPERSTACK_ENDPOINTS = {"CANADA-1": "https://ca1.obj.nexgencloud.io"}


def S3(*, region: str = "us-east-1", access_key: Credential | None = None,
       secret_key: Credential | None = None) -> Storage:
    """Amazon S3 in ``region``; without keys, boto3's chain (env, profile, instance role).

    As a Volume's storage on AWS nodes without keys, the node's instance profile is used.
    """
    return Storage(endpoint=f"https://s3.{region}.amazonaws.com", access_key=access_key,
                   secret_key=secret_key, region=region)


def R2(*, account_id: str, access_key: Credential, secret_key: Credential) -> Storage:
    """Cloudflare R2 of ``account_id`` (R2 signs with the region ``auto``)."""
    if not account_id:
        raise ConfigError("R2 needs the Cloudflare account_id (dashboard > R2 > Account ID)")
    return Storage(endpoint=f"https://{account_id}.r2.cloudflarestorage.com",
                   access_key=access_key, secret_key=secret_key, region="auto")


def GCS(*, access_key: Credential | None = None,
        secret_key: Credential | None = None) -> Storage:
    """Google Cloud Storage through its S3-compatible XML API, with HMAC keys.

    Without keys it is only useful as a Volume's storage on GCP nodes, which then mount the
    bucket with gcsfuse as the node's service account.
    """
    return Storage(endpoint=GCS_ENDPOINT, access_key=access_key, secret_key=secret_key,
                   region="auto")


def Wasabi(*, region: str = "us-east-1", access_key: Credential,
           secret_key: Credential) -> Storage:
    """Wasabi in ``region`` (e.g. ``eu-central-1``); requests are signed for that region."""
    return Storage(endpoint=f"https://s3.{region}.wasabisys.com", access_key=access_key,
                   secret_key=secret_key, region=region)


def Backblaze(*, region: str, key_id: Credential, app_key: Credential) -> Storage:
    """Backblaze B2's S3 API in ``region`` (e.g. ``us-west-004``) with an application key."""
    return Storage(endpoint=f"https://s3.{region}.backblazeb2.com", access_key=key_id,
                   secret_key=app_key, region=region)


def Hyperstack(*, api_key: str | None = None, region: str = "CANADA-1",
               endpoint: str | None = None, api_url: str = HYPERSTACK_API) -> Storage:
    """Hyperstack object storage with an access key minted through the Hyperstack API.

    ``api_key`` defaults to ``HYPERSTACK_API_KEY``. The key pair is created on first use (one
    per preset call), described as made by skyward_iac, and deleted when this process exits.
    ``endpoint`` overrides the region's S3 endpoint (known: CANADA-1).
    """
    resolved = endpoint or HYPERSTACK_ENDPOINTS.get(region)
    if resolved is None:
        raise ConfigError(f"no known Hyperstack object-storage endpoint for region {region!r} "
                          f"(known: {sorted(HYPERSTACK_ENDPOINTS)}); pass endpoint=...")
    keys = _HyperstackKeys(api_key, region, api_url)
    return Storage(endpoint=resolved, access_key=keys.access_key, secret_key=keys.secret_key,
                   path_style=True, region=region)


class _HyperstackKeys:
    """One access key pair minted on first use and deleted at exit; safe across threads."""

    def __init__(self, api_key: str | None, region: str, api_url: str) -> None:
        self._api_key, self._region, self._api_url = api_key, region, api_url.rstrip("/")
        self._lock = threading.Lock()
        self._pair: tuple[str, str] | None = None

    def __repr__(self) -> str:  # never the api key
        return f"HyperstackKeys(region={self._region!r})"

    def access_key(self) -> str:
        return self._mint()[0]

    def secret_key(self) -> str:
        return self._mint()[1]

    def _mint(self) -> tuple[str, str]:
        with self._lock:
            if self._pair is None:
                made = self._call("POST", "/object-storage/access-keys", {
                    "region": self._region,
                    "description": f"skyward_iac {datetime.now(UTC):%Y-%m-%d %H:%M:%S}Z",
                })
                try:
                    self._pair = (str(made["access_key"]), str(made["secret_key"]))
                except (KeyError, TypeError):
                    raise StorageError("the Hyperstack API answered without an access key "
                                       "pair") from None
                if "id" in made:
                    atexit.register(self._delete, made["id"])
            return self._pair

    def _delete(self, key_id: Any) -> None:
        # At exit there is nobody left to tell; a key that survives shows in the console.
        with contextlib.suppress(StorageError):
            self._call("DELETE", f"/object-storage/access-keys/{key_id}", None)

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        api_key = self._api_key or os.environ.get("HYPERSTACK_API_KEY")
        if not api_key:
            raise ConfigError("Hyperstack storage needs an API key: pass api_key= or set "
                              "HYPERSTACK_API_KEY")
        request = urllib.request.Request(
            self._api_url + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"api_key": api_key, "accept": "application/json",
                     "content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read().decode() or "{}"
        except urllib.error.HTTPError as exc:
            raise StorageError(f"Hyperstack API {method} {path} failed: HTTP {exc.code} "
                               f"{exc.reason}") from None
        except OSError as exc:
            raise StorageError(f"cannot reach the Hyperstack API at {self._api_url}: "
                               f"{exc}") from None
        parsed = json.loads(text)
        # The API wraps some answers in {"status": ..., "access_key": {...}}.
        if isinstance(parsed, dict) and isinstance(parsed.get("access_key"), dict):
            return dict(parsed["access_key"])
        return dict(parsed) if isinstance(parsed, dict) else {}
