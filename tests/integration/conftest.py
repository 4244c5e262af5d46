"""A real Local pool shared by the integration tests that only need to run tasks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import skyward_iac as sky


@pytest.fixture(scope="session")
def pool() -> Iterator[sky.Pool]:
    """Two Local nodes (real stack, real sshd, real agents) for the whole test session."""
    with sky.Compute(
        provider=sky.Local(), nodes=2, options=sky.Options(default_compute_timeout=60)
    ) as pool:
        yield pool
