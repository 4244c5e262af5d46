"""``sky.storage``: object stores. ``Storage`` (``sky.Storage``) moves files to and from any
S3-compatible store; the presets (``S3``, ``R2``, ``GCS``, ``Wasabi``, ``Backblaze``,
``Hyperstack``) build one with each store's real endpoint."""

from skyward_iac.api.storage import Credential
from skyward_iac.storage.client import Storage
from skyward_iac.storage.presets import GCS, R2, S3, Backblaze, Hyperstack, Wasabi

__all__ = ["GCS", "R2", "S3", "Backblaze", "Credential", "Hyperstack", "Storage", "Wasabi"]
