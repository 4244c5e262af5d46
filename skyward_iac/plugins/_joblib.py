"""``sky.plugins.joblib`` and ``sky.plugins.sklearn``: joblib's parallel loops (and so
scikit-learn's ``n_jobs``) run their tasks on the pool.

Inside ``with sky.Compute(..., plugins=[sky.plugins.sklearn()])`` the joblib backend
``"skyward"`` is the default in the thread that entered the pool: each joblib batch becomes one
pool task, and ``n_jobs=-1`` means every task slot of the pool.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from skyward_iac.api.plugin import Cluster, Plugin
from skyward_iac.plugins._support import client_version, with_packages

if TYPE_CHECKING:
    from skyward_iac.api.spec import Image
    from skyward_iac.orchestration.pool import Pool

#: The name the backend is registered under (``joblib.parallel_config(backend="skyward")``).
BACKEND = "skyward"


def joblib(*, version: str | None = None) -> Plugin:
    """Install joblib (``None``: the client's version) and send joblib's tasks to the pool."""
    packages = (("joblib", version),)
    return (
        Plugin.create("joblib")
        .with_image_transform(functools.partial(_install, "joblib", packages))
        .with_around_client(pool_backend)
    )


def sklearn(*, version: str | None = None) -> Plugin:
    """Install scikit-learn (``None``: the client's version) with the client's joblib, numpy
    and scipy (estimators travel as pickles), and send ``n_jobs`` work to the pool."""
    packages = (("scikit-learn", version), ("joblib", None), ("numpy", None), ("scipy", None))
    return (
        Plugin.create("sklearn")
        .with_image_transform(functools.partial(_install, "sklearn", packages))
        .with_around_client(pool_backend)
    )


def _install(plugin: str, packages: tuple[tuple[str, str | None], ...], image: Image,
             cluster: Cluster) -> Image:
    pins = [f"{name}=={version or client_version(name, plugin)}" for name, version in packages]
    return with_packages(image, pins)


@contextlib.contextmanager
def pool_backend(pool: Pool, cluster: Cluster) -> Iterator[None]:
    """Make the ``"skyward"`` backend, bound to ``pool``, joblib's default in this thread."""
    import joblib as joblib_module  # type: ignore[import-untyped]

    from skyward_iac.plugins._joblib_backend import PoolBackend

    joblib_module.register_parallel_backend(BACKEND, functools.partial(PoolBackend, pool=pool))
    with joblib_module.parallel_config(backend=BACKEND):
        yield


