"""``NodeEvents``: what a pool does when one of its nodes speaks or goes away.

Every node reports through here: its tasks' output (to the user's sink and as ``sky.Log``
events), its metric samples (``sky.Metric``), its cloud's preemption notice, a broken agent
connection (with its unfinished calls), a failed health check and a silent heartbeat. The last
four take one path: the node leaves service first (``Membership``), its unfinished calls go to
the ``Dispatcher`` (held until it is fenced), it is fenced over SSH if it still answers, and
the reconciler recreates it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from skyward_iac.node.messages import PreemptionNotice
from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.events import InstancePreempted, Log, Metric
from skyward_iac.orchestration.dispatch import Dispatcher
from skyward_iac.orchestration.heartbeat import Heartbeat
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.orchestration.membership import Membership
from skyward_iac.orchestration.node import Node, NodeLaunch
from skyward_iac.remote.agent_client import Submission

log = logging.getLogger("skyward")


class NodeEvents:
    """The callbacks every node of one pool reports to (see the module doc)."""

    def __init__(self, identity: PoolIdentity, membership: Membership, dispatcher: Dispatcher,
                 events: EventBus, on_output: Callable[[int, str, str], Any],
                 heartbeat: Heartbeat | None = None) -> None:
        self.identity = identity
        self.membership = membership
        self.dispatcher = dispatcher
        self.events = events
        self.on_output = on_output
        self.heartbeat = heartbeat

    def launch(self, ssh_timeout: float, ssh_retry_interval: float,
               plugins: bytes | None) -> NodeLaunch:
        """What every node start of the pool is given: these callbacks, the dispatcher's and
        the heartbeat's (the one place a node's agent callbacks come from)."""
        return NodeLaunch(
            identity=self.identity, ssh_timeout=ssh_timeout,
            ssh_retry_interval=ssh_retry_interval,
            on_output=self.output, on_lost=self.lost, on_event=self.events.emit,
            on_contact=self.heartbeat.add if self.heartbeat is not None else None,
            on_attached=self.heartbeat.attached if self.heartbeat is not None else None,
            on_metrics=self.metrics, on_preemption=self.preempted,
            on_results=self.dispatcher.slots_freed, on_started=self.dispatcher.events.started,
            task_ids=self.dispatcher.task_ids, plugins=plugins)

    # ---- what nodes say ---------------------------------------------------------------------

    def output(self, node: int, stream: str, text: str) -> None:
        """A task's output: to the user's sink, and as ``Log`` events to whoever wants them."""
        self.on_output(node, stream, text)
        if self.events.listens(Log):
            for line in text.splitlines():
                self.events.emit(Log(stack=self.identity.stack, line=line, node=node,
                                     stream=stream))

    def metrics(self, node: int, samples: tuple[Any, ...]) -> None:
        """A node's ``node.sampler.MetricSample``s, as ``Metric`` events."""
        for sample in samples:
            self.events.emit(Metric(stack=self.identity.stack, node=node, name=sample.name,
                                    value=sample.value, unit=sample.unit, device=sample.device,
                                    timestamp=sample.timestamp))

    # ---- nodes leaving service ----------------------------------------------------------------

    def lost(self, index: int, submissions: list[Submission], reason: str) -> None:
        """A node's connection broke (its agent client reports it with its unfinished calls)."""
        self.out_of_service(index, reason, submissions)

    def unhealthy(self, index: int, reason: str) -> None:
        self.out_of_service(index, reason, [])

    def preempted(self, index: int, notice: PreemptionNotice) -> None:
        left = max(0.0, notice.deadline - time.time())
        self.out_of_service(index, f"{notice.reason}; it stops in {left:.0f}s", [])

    def silent(self, index: int, reason: str) -> None:
        self.out_of_service(index, reason, [])

    def out_of_service(self, index: int, reason: str, lost: list[Submission]) -> None:
        """The one path for every node that leaves service unexpectedly (see the module doc)."""
        node = self.membership.lose(index, reason)
        self.dispatcher.out_of_service(index, reason)
        if node is not None:
            lost = lost + node.agent.close()
        self.dispatcher.lost(index, lost, reason)
        if node is None:
            return
        stack = self.identity.stack
        self.events.report(InstancePreempted(stack=stack, node=index, reason=reason), log,
                           logging.WARNING, "stack %s: node %d out of service (%s); replacing it",
                           stack, index, reason)
        threading.Thread(target=self._fence, args=(node,), name=f"fence-node-{index}",
                         daemon=True).start()

    def _fence(self, node: Node) -> None:
        """Kill what is left of a lost node over SSH; if that works its calls run again at
        once, otherwise when the stack update that recreates it has removed it."""
        if node.fence():
            self.dispatcher.fenced(node.index)
        self.gone(node.index, node.connection)
        try:
            node.close()
        except Exception as exc:  # noqa: BLE001 - it is being replaced anyway
            log.debug("node %d: closing after it was lost: %s", node.index, exc)

    def gone(self, index: int, connection: Any) -> None:
        """Node ``index`` (reached through ``connection``) leaves for good: stop beating it."""
        if self.heartbeat is not None:
            self.heartbeat.remove(index, connection)
