"""A JAX cluster environment for skyward pools, found by ``jax.distributed.initialize()``.

Imported on nodes only (it imports JAX), by the ``jax`` plugin's ``around_process``.
"""

from __future__ import annotations

import os

from jax._src.clusters import ClusterEnv  # type: ignore[import-not-found]


class SkywardCluster(ClusterEnv):
    """Reads what ``sky.plugins.jax`` set: coordinator (the head), process count and id."""

    name = "skyward"

    @classmethod
    def is_env_present(cls) -> bool:
        return all(name in os.environ for name in
                   ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"))

    @classmethod
    def get_coordinator_address(cls, timeout_secs: int | None,
                                override_coordinator_port: str | None) -> str:
        address = os.environ["JAX_COORDINATOR_ADDRESS"]
        if override_coordinator_port:
            address = f"{address.rsplit(':', 1)[0]}:{override_coordinator_port}"
        return address

    @classmethod
    def get_process_count(cls) -> int:
        return int(os.environ["JAX_NUM_PROCESSES"])

    @classmethod
    def get_process_id(cls) -> int:
        return int(os.environ["JAX_PROCESS_ID"])
