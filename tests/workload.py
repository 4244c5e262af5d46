"""Keeping a pool busy while something happens to it (a node replaced, preempted ...)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def repeatedly(action: Callable[[], T]) -> Iterator[list[T]]:
    """Run ``action`` over and over in a thread for the length of the block; its results."""
    results: list[T] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            results.append(action())

    worker = threading.Thread(target=loop, name="test-workload")
    worker.start()
    try:
        yield results
    finally:
        stop.set()
        worker.join(120)


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False
