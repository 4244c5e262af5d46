"""Shared fixtures: an isolated skyward home per test session and helpers to inspect nodes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward_iac.infra.engine import locate as engine

#: The local S3 server fixtures (``server``, ``storage``) for the storage and volume tests, how
#: the suite is cut into units for pytest-xdist (tests/scheduling.py), and the warning for a
#: pool that outlives its test file (tests/pool_threads.py).
pytest_plugins = ["tests.s3_server", "tests.scheduling", "tests.pool_threads"]


@pytest.fixture(scope="session", autouse=True)
def skyward_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test session gets its own state backend, passphrase and node sandboxes.

    The engine stays where scripts/setup built it (found before the home moves).
    """
    previous = {k: os.environ.get(k) for k in ("SKYWARD_HOME", "SKYWARD_PULUMI_ROOT")}
    try:
        found = engine.find_engine()
        os.environ["SKYWARD_PULUMI_ROOT"] = str(found.root)
    except Exception:  # the unit tests about a missing engine still run
        pass
    home = tmp_path_factory.mktemp("skyward-home")
    os.environ["SKYWARD_HOME"] = str(home)
    engine.find_engine.cache_clear()
    yield home
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    engine.find_engine.cache_clear()
