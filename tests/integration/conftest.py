"""Real Local pools shared by the integration tests that only need to run tasks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

import skyward_iac as sky
from skyward_iac.orchestration.pool import print_output


@dataclass
class OutputRecorder:
    """Remote output as it arrives: (monotonic time, node, stream, text)."""

    lines: list[tuple[float, int, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, node: int, stream: str, text: str) -> None:
        with self.lock:
            self.lines.append((time.monotonic(), node, stream, text))
        print_output(node, stream, text)

    def text(self, marker: str) -> list[tuple[int, str, str]]:
        """(node, stream, text) of every chunk containing ``marker``."""
        with self.lock:
            return [(n, s, t) for _, n, s, t in self.lines if marker in t]


@pytest.fixture(scope="session")
def output() -> OutputRecorder:
    return OutputRecorder()


@pytest.fixture(scope="session")
def pool(output: OutputRecorder) -> Iterator[sky.Pool]:
    """Two Local nodes (real stack, real sshd, real agents), thread executor, one slot each."""
    with sky.Compute(
        provider=sky.Local(), nodes=2, options=sky.Options(default_compute_timeout=60),
        on_output=output,
    ) as pool:
        yield pool


@pytest.fixture(scope="session")
def process_pool() -> Iterator[sky.Pool]:
    """One Local node with two process slots (processes reused between tasks)."""
    worker = sky.Worker(concurrency=2, executor="process")
    with sky.Compute(
        provider=sky.Local(), nodes=1, options=sky.Options(worker=worker, default_compute_timeout=60)
    ) as pool:
        yield pool
