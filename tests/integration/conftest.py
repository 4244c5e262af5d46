"""Real Local pools shared by the integration tests that only need to run tasks."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.orchestration.pool import print_output
from tests.scheduling import SHARED_POOLS


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


#: The shared pools now open, by fixture name: each one's ``with`` block and its pool.
_open: dict[str, tuple[contextlib.ExitStack, sky.Pool]] = {}


def _shared(name: str, compute: Callable[[], sky.Compute]) -> sky.Pool:
    """The pool ``name``, brought up at the first test that asks for it."""
    if name not in _open:
        block = contextlib.ExitStack()
        _open[name] = (block, block.enter_context(compute()))
    return _open[name][1]


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Close the shared pools once this worker's next test is neither in a file that uses them
    nor asks for one (a session-scoped pool lived on, beating, streaming its metrics and
    printing them into other tests' output, through the rest of the worker's session: ~25
    minutes). The files that use them are one xdist unit (``SHARED_POOLS``), so each pool is
    still made once per run."""
    if nextitem is not None and nextitem.nodeid.split("::", 1)[0] in SHARED_POOLS:
        return
    for name in [n for n in _open if not _uses(nextitem, n)]:
        _open.pop(name)[0].close()


def _uses(item: pytest.Item | None, name: str) -> bool:
    """Whether ``item`` asks for this module's fixture ``name`` (not a file's own ``pool``)."""
    info = getattr(item, "_fixtureinfo", None)
    definitions: Sequence[Any] = info.name2fixturedefs.get(name, ()) if info is not None else ()
    return bool(definitions) and getattr(definitions[-1].func, "__module__", None) == __name__


@pytest.fixture
def pool(output: OutputRecorder) -> sky.Pool:
    """Two Local nodes (real stack, real sshd, real agents), thread executor, one slot each."""
    return _shared("pool", lambda: sky.Compute(
        provider=sky.Local(), nodes=2, options=sky.Options(default_compute_timeout=60),
        on_output=output,
    ))


@pytest.fixture
def process_pool() -> sky.Pool:
    """One Local node with two process slots (processes reused between tasks)."""
    worker = sky.Worker(concurrency=2, executor="process")
    return _shared("process_pool", lambda: sky.Compute(
        provider=sky.Local(), nodes=1, options=sky.Options(worker=worker, default_compute_timeout=60)
    ))
