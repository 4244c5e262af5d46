"""``TaskTally``: a pool's finished calls counted, reported as ``TaskProgress`` a few times a
second instead of three events per call.

Counting costs a lock and an integer per call; the report runs on a timer thread, at most once
every ``interval`` seconds while calls move, and once more after the last change, so the final
state is always reported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from skyward_iac.observability.events import TaskProgress

#: Seconds between two ``TaskProgress`` events of one pool, at least.
PROGRESS_EVERY = 0.25


class Named(Protocol):
    """What names the pool (``orchestration.identity.PoolIdentity``, shared by its parts)."""

    @property
    def stack(self) -> str: ...


class TaskTally:
    """Succeeded and failed calls of the pool ``pool`` names; ``load()`` gives (queued,
    running)."""

    def __init__(self, pool: Named, load: Callable[[], tuple[int, int]],
                 emit: Callable[[TaskProgress], Any], interval: float = PROGRESS_EVERY) -> None:
        self.pool = pool
        self.interval = interval
        self.succeeded = 0
        self.failed = 0
        self._load = load
        self._emit = emit
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._reported_at = float("-inf")

    def completed(self, success: bool) -> None:
        """Count a finished call and schedule a report."""
        with self._lock:
            if success:
                self.succeeded += 1
            else:
                self.failed += 1
            self._schedule()

    def counted_if_reporting(self, success: bool) -> bool:
        """Count a finished call when a report is scheduled already (it reads the counts when
        it runs), starting nothing; False, nothing counted, when none is (then ``completed``)."""
        with self._lock:
            if self._timer is None:
                return False
            if success:
                self.succeeded += 1
            else:
                self.failed += 1
            return True

    def changed(self) -> None:
        """Calls were queued or moved: schedule a report."""
        with self._lock:
            self._schedule()

    def flush(self) -> None:
        """Report now instead of waiting for a pending report (the pool is closing)."""
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            self._report()

    def _schedule(self) -> None:
        # With _lock held. One pending report at a time: it reads the counts when it runs.
        if self._timer is None:
            delay = max(0.0, self._reported_at + self.interval - time.monotonic())
            self._timer = threading.Timer(delay, self._report)
            self._timer.daemon = True
            self._timer.name = f"{self.pool.stack}-progress"
            self._timer.start()

    def _report(self) -> None:
        with self._lock:
            if self._timer is threading.current_thread():
                self._timer = None
            self._reported_at = time.monotonic()
            succeeded, failed = self.succeeded, self.failed
        queued, running = self._load()
        self._emit(TaskProgress(self.pool.stack, queued, running, succeeded, failed))
