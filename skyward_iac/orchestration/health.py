"""The client's health checks: run ``Options.health_checker`` on every node, replace failing ones.

``FailureTally`` is the policy (consecutive failures per node, pure); ``HealthMonitor`` is the
I/O: a daemon thread that sends the probe to each node's agent directly, outside the pool's
queue, so a probe never takes a user slot for longer than its timeout and is never retried.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from skyward_iac.api.function import function
from skyward_iac.api.health import HealthChecker
from skyward_iac.orchestration.node import Node
from skyward_iac.remote.calls import PackedCall, pack_call

log = logging.getLogger("skyward")
#: Extra seconds the client waits past the probe's timeout (the agent client fails it first).
GRACE = 2.0


@dataclass
class FailureTally:
    """Consecutive probe failures per node index; a replaced node starts again from zero."""

    limit: int
    counts: dict[int, int] = field(default_factory=dict)

    def record(self, index: int, passed: bool) -> bool:
        """Count one probe outcome; True when ``index`` has just reached ``limit`` failures
        (the count restarts, so the caller acts once per streak)."""
        if passed:
            self.counts.pop(index, None)
            return False
        self.counts[index] = self.counts.get(index, 0) + 1
        if self.counts[index] >= self.limit:
            del self.counts[index]
            return True
        return False

    def forget(self, index: int) -> None:
        """``index`` is a new node now (replaced): its predecessor's failures do not count."""
        self.counts.pop(index, None)


def probe_outcome(future: Future[object], timeout: float) -> tuple[bool, str]:
    """Whether one probe passed, and why not: a falsy value, an exception, or no answer."""
    try:
        value = future.result(timeout=timeout + GRACE)
    except FutureTimeout:
        return False, f"no answer within {timeout:g}s"
    except Exception as exc:  # noqa: BLE001 - any failure of the user's check counts
        return False, f"{type(exc).__name__}: {exc}"
    return (True, "") if value else (False, f"check returned {value!r}")


class HealthMonitor:
    """A daemon thread probing every node in service each ``checker.interval`` seconds.

    ``nodes()`` gives the nodes in service now; ``on_unhealthy(index, reason)`` is called once
    per failing streak (the node then leaves service and is recreated).
    """

    def __init__(self, checker: HealthChecker, nodes: Callable[[], Sequence[Node]], slots: int,
                 on_unhealthy: Callable[[int, str], None]) -> None:
        self.checker = checker
        self.nodes = nodes
        self.slots = slots
        self.on_unhealthy = on_unhealthy
        self.tally = FailureTally(checker.failures)
        self._probe: PackedCall = pack_call(function(checker.check)(), copy=False)
        self._name = f"health check {getattr(checker.check, '__name__', 'check')}"
        self._known: dict[int, Node] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skyward-health", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self.checker.interval):
            try:
                self.probe_all()
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.warning("health check round failed: %s", exc)

    def probe_all(self) -> None:
        """One round: probe every eligible node at once, then count the outcomes."""
        sent: list[tuple[int, Future[object]]] = []
        for node in self.nodes():
            index = node.index
            if self._known.get(index) is not node:
                self._known[index] = node
                self.tally.forget(index)
            if node.agent.in_flight >= self.slots:
                continue  # busy answering user tasks
            try:
                future = node.agent.submit(self._name, self._probe.payload, self.checker.timeout,
                                           self._probe.buffers)
            except Exception as exc:  # noqa: BLE001 - a lost connection is handled elsewhere
                log.debug("health check of node %d not sent: %s", index, exc)
                continue
            sent.append((index, future))
        for index, future in sent:
            passed, why = probe_outcome(future, self.checker.timeout)
            if self._stopped.is_set():
                return
            if not passed:
                log.warning("node %d failed its health check: %s", index, why)
            if self.tally.record(index, passed):
                self.on_unhealthy(index, f"failed its health check {self.checker.failures} "
                                         f"time(s) in a row ({why})")

    def stop(self) -> None:
        """Stop probing (the pool is closing)."""
        self._stopped.set()
        self._thread.join(timeout=self.checker.timeout + GRACE + 1)
