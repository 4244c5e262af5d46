"""The log consoles (``Options.console="log"`` and ``"minimal"``): plain, append-only
``HH:MM:SS`` lines, one per step, readable in a file or a pipe (console.py chooses them)."""

from __future__ import annotations

import time
from typing import TextIO

from skyward_iac.observability.console import (
    Console,
    changes,
    metrics_summary,
    seconds,
    short_stack,
    usd,
)
from skyward_iac.observability.events import (
    BootstrapPhase,
    BudgetWarning,
    ClusterDestroyed,
    ClusterProvisioned,
    ClusterReady,
    ClusterRequested,
    Error,
    Event,
    InstanceBootstrapped,
    InstanceDestroyed,
    InstanceLaunched,
    InstancePreempted,
    InstanceProvisioned,
    InstanceReplaced,
    Log,
    Metric,
    ProvisionRetried,
    StackDestroyed,
    StackPreviewed,
    StackProgress,
    StackUpdated,
    TaskCompleted,
    TaskProgress,
)
from skyward_iac.observability.logging import redact
from skyward_iac.observability.streams import write_lines
from skyward_iac.observability.view import StackView

#: How often the log console prints a node's metrics (they arrive every second or so).
METRICS_EVERY = 30.0
#: How often the log console prints a pool's task counts while tasks run (one line per task
#: would flood a 10,000-task ``map``); the final counts and failures are always printed.
PROGRESS_EVERY = 5.0



class LogConsole(Console):
    """Append-only ``HH:MM:SS message`` lines, one per step; flushed at once, for tail/polling."""

    def __init__(self, stream: TextIO, *, show_logs: bool = False) -> None:
        super().__init__()
        self.stream = stream
        self.show_logs = show_logs
        self._metrics_printed: dict[tuple[str, int], float] = {}
        #: Per stack: when task counts were last printed, and what they were.
        self._progress_printed: dict[str, tuple[float, tuple[int, ...]]] = {}

    def _render(self, event: Event, view: StackView | None) -> None:
        text = self.describe(event, view)
        if text is None:
            return
        if len(self.view.active()) > 1 and view is not None:
            text = f"[{short_stack(view.stack)}] {text}"
        clock = time.strftime("%H:%M:%S", time.localtime(event.timestamp))
        # Never inside a line the user's code is printing to the same file (streams.py).
        write_lines(self.stream, "".join(f"{clock} {line}\n"
                                         for line in redact(text).splitlines() or [""]))

    def describe(self, event: Event, view: StackView | None) -> str | None:  # noqa: C901
        """The line for ``event``, or None when this console does not show it."""
        match event:
            case ClusterRequested():
                what = ", ".join(x for x in (event.accelerator, event.instance_type,
                                             event.region, event.market) if x)
                return (f"stack {event.stack}: requesting {event.nodes} node(s) on "
                        f"{event.provider}{f' ({what})' if what else ''}, "
                        f"{usd(event.hourly_usd)}/h{' (est.)' if event.estimated else ''}")
            case StackProgress(status="started"):
                return None
            case StackProgress():
                total = f"/{event.total}" if event.total else ""
                verb = "FAILED " if event.status == "failed" else ""
                return (f"pulumi {event.operation} [{event.done}{total}] {verb}{event.op} "
                        f"{event.name} ({event.type.rsplit(':', 1)[-1]})")
            case StackUpdated():
                return f"pulumi up done in {seconds(event.duration)}: {changes(event.changes)}"
            case StackPreviewed():
                return f"pulumi preview: {changes(event.changes)}"
            case StackDestroyed():
                return (f"pulumi destroy done in {seconds(event.duration)}: "
                        f"{event.deleted} resource(s) deleted")
            case ClusterProvisioned():
                return f"{event.nodes} node(s) provisioned in {seconds(event.duration)}"
            case InstanceLaunched():
                kind = f" ({event.instance_type})" if event.instance_type else ""
                return f"node {event.node}: launching{kind}"
            case InstanceProvisioned():
                where = f" at {event.address}" if event.address else ""
                return f"node {event.node}: provisioned{where}"
            case BootstrapPhase(status="started"):
                place = f" [{event.index + 1}/{event.total}]" \
                    if event.index is not None and event.total else ""
                return f"node {event.node}: bootstrap{place} {event.phase}"
            case BootstrapPhase(status="completed"):
                took = f" in {seconds(event.duration)}" if event.duration is not None else ""
                return f"node {event.node}: bootstrap {event.phase} done{took}"
            case BootstrapPhase():
                return f"node {event.node}: bootstrap {event.phase} FAILED: {event.detail}"
            case InstanceBootstrapped():
                return f"node {event.node}: ready in {seconds(event.duration)}"
            case ClusterReady():
                warm = " (adopted warm pool)" if event.adopted else ""
                return (f"pool {event.stack} ready: {event.nodes} node(s) in "
                        f"{seconds(event.duration)}{warm}, {usd(event.hourly_usd)}/h")
            case ProvisionRetried():
                where = f"{event.region}{f' ({event.zone})' if event.zone else ''}"
                return (f"stack {event.stack}: no capacity ({event.reason}); trying {where}, "
                        f"{event.why} (place {event.attempt})")
            case InstancePreempted():
                return f"node {event.node}: PREEMPTED{f': {event.reason}' if event.reason else ''}"
            case InstanceReplaced():
                return f"node {event.node}: replaced by a new instance {event.instance_id}".rstrip()
            case InstanceDestroyed():
                return f"node {event.node}: destroyed"
            case TaskProgress():
                return self._progress_line(event)
            case TaskCompleted(success=False):
                where = f"on node {event.node}" if event.node >= 0 else "before reaching a node"
                took = f" after {seconds(event.duration)}" if event.duration else ""
                return f"task {event.task_id} {event.name} FAILED {where}{took}: {event.error}"
            case Metric():
                return self._metrics_line(event, view)
            case Log():
                if not self.show_logs:
                    return None
                return f"[node {event.node}] {event.line}" if event.node is not None \
                    else f"[{event.stream}] {event.line}"
            case BudgetWarning():
                return f"WARNING {event.message}"
            case Error():
                where = f"node {event.node}: " if event.node is not None else ""
                return f"{'FATAL' if event.fatal else 'ERROR'} {where}{event.message}"
            case ClusterDestroyed():
                # The view knows when billing began, should the emitter leave these at 0.
                cost = event.cost_usd or (view.cost() if view else 0.0)
                since = view.billing_since if view else None
                uptime = event.uptime or (event.timestamp - since if since else 0.0)
                warm = "adopted warm pool, " if event.adopted else ""
                return (f"stack {event.stack} destroyed in {seconds(event.duration)}; {warm}up "
                        f"{seconds(uptime)}, cost {usd(cost)}")
        return None

    def _progress_line(self, event: TaskProgress) -> str | None:
        """Task counts every ``PROGRESS_EVERY`` seconds while tasks run, and once when they
        are all done (unless those counts were just printed)."""
        counts = (event.queued, event.running, event.succeeded, event.failed)
        printed_at, printed = self._progress_printed.get(event.stack, (float("-inf"), ()))
        idle = not event.queued and not event.running
        if counts == printed or (not idle and event.timestamp - printed_at < PROGRESS_EVERY):
            return None
        self._progress_printed[event.stack] = (event.timestamp, counts)
        return (f"tasks: {event.queued} queued, {event.running} running, "
                f"{event.succeeded} done, {event.failed} failed")

    def _metrics_line(self, event: Metric, view: StackView | None) -> str | None:
        key = (event.stack, event.node)
        last = self._metrics_printed.get(key)
        if view is None or (last is not None and event.timestamp - last < METRICS_EVERY):
            return None
        self._metrics_printed[key] = event.timestamp
        summary = metrics_summary(view.node(event.node).metrics)
        return f"node {event.node}: {summary}" if summary else None


class MinimalConsole(LogConsole):
    """Log lines for milestones and failures only: requested, ready, destroyed, errors."""

    _SHOWN = (ClusterRequested, ClusterReady, ClusterDestroyed, Error, InstancePreempted,
              InstanceReplaced, Log)

    def describe(self, event: Event, view: StackView | None) -> str | None:
        if isinstance(event, self._SHOWN) or (
                isinstance(event, BootstrapPhase) and event.status == "failed") or (
                isinstance(event, TaskCompleted) and not event.success):
            return super().describe(event, view)
        return None


# ---- formatting shared with the rich console ----------------------------------------------
