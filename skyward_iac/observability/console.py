"""The console: what a pool shows while it works, chosen by ``Options.console``.

* ``"rich"``: a live view (per-node progress, Pulumi resource progress, tasks, USD/hour and
  cost so far), drawn with ``rich`` on a terminal;
* ``"log"``: plain, append-only ``HH:MM:SS`` lines, readable in a file or a pipe;
* ``"minimal"``: the same lines, milestones and failures only;
* ``"silent"``: nothing.

``True`` (the default) means rich on a terminal and log otherwise; a ``"rich"`` request on a
stream that is not a terminal also falls back to log, since a redrawn view is unreadable once
captured. In a Jupyter kernel, rich is a display in the cell that is updated in place (HTML,
and plain text for frontends without HTML), never terminal escape codes.
``console_for(mode).start(bus)`` subscribes it; ``stop()`` ends it.
``acquire_console(mode, bus)`` does the same for a console shared by every pool of the process.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, TextIO

from skyward_iac.api.errors import ConfigError
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
from skyward_iac.observability.streams import track_streams, write_lines
from skyward_iac.observability.view import PoolView, StackView

if TYPE_CHECKING:
    from skyward_iac.observability.bus import EventBus, Subscription

ConsoleMode = Literal["rich", "log", "minimal", "silent"]
MODES: tuple[str, ...] = ("rich", "log", "minimal", "silent")
#: How often the log console prints a node's metrics (they arrive every second or so).
METRICS_EVERY = 30.0
#: How often the log console prints a pool's task counts while tasks run (one line per task
#: would flood a 10,000-task ``map``); the final counts and failures are always printed.
PROGRESS_EVERY = 5.0


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal that can redraw (not ``TERM=dumb``)."""
    import os

    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


_kernel_seen = False


def in_jupyter_kernel() -> bool:
    """Whether this process is a Jupyter kernel (ipykernel): its frontend shows rich displays
    and routes output by cell. Never imports IPython: a process that has not, is no kernel."""
    global _kernel_seen
    if not _kernel_seen:  # once a kernel, always one: later calls cost a global read
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        _kernel_seen = getattr(shell, "kernel", None) is not None
    return _kernel_seen


def console_for(mode: bool | str, stream: TextIO | None = None, *,
                show_logs: bool = False) -> Console:
    """The console for ``Options.console``: ``True``/``"rich"``/``"log"``/``"minimal"``/
    ``"silent"``/``False``, writing to ``stream`` (stderr by default).

    ``show_logs``: also print ``Log`` events (task output routed through the bus).
    """
    if mode is True:
        mode = "rich"
    elif mode is False:
        mode = "silent"
    if not isinstance(mode, str) or mode not in MODES:
        raise ConfigError(f"console must be True, False or one of {', '.join(map(repr, MODES))}, "
                          f"got {mode!r}")
    if mode == "silent":
        return SilentConsole()
    if mode == "rich" and stream is None and in_jupyter_kernel():
        from skyward_iac.observability.console_rich import JupyterConsole

        return JupyterConsole(show_logs=show_logs)
    stream = stream if stream is not None else sys.stderr
    if mode == "rich" and is_terminal(stream):
        from skyward_iac.observability.console_rich import RichConsole

        return RichConsole(stream, show_logs=show_logs)
    if mode == "minimal":
        return MinimalConsole(stream, show_logs=show_logs)
    return LogConsole(stream, show_logs=show_logs)


_shared: dict[tuple[object, ...], tuple[Console, int]] = {}
_shared_lock = threading.Lock()


def acquire_console(mode: bool | str, bus: EventBus, stream: TextIO | None = None, *,
                    show_logs: bool = False) -> Callable[[], None]:
    """Show ``bus``'s events on this process's console for ``mode``; returns ``release()``.

    Pools alive at the same time (``MultiPool``, ``Session``) share one console, since a
    terminal holds one live view; it stops when the last pool releases it. In a notebook each
    pool has its own display, in the cell that opened it.
    """
    # The user's prints are tracked even for a silent console: remote output and warnings
    # still reach the same streams, and must not land inside a user's line.
    track_streams()
    console = console_for(mode, stream, show_logs=show_logs)
    if isinstance(console, SilentConsole):
        # Nothing to show: no subscriber, so the pool builds no per-task events either.
        return lambda: None
    key: tuple[object, ...] = (type(console).__name__,
                               id(getattr(console, "stream", None) or stream or sys.stderr))
    if not console.one_view:
        key += (id(bus),)  # its own view for each pool
    with _shared_lock:
        shared, count = _shared.get(key, (console, 0))
        _shared[key] = (shared, count + 1)
        if count == 0:
            shared.start()
        subscription = shared.attach(bus)
    released = threading.Event()

    def release() -> None:
        if released.is_set():
            return
        released.set()
        subscription.cancel()
        with _shared_lock:
            current, left = _shared[key]
            if left <= 1:
                del _shared[key]
                current.stop()
            else:
                _shared[key] = (current, left - 1)

    return release


class Console:
    """A renderer of pool events. ``start(bus)`` subscribes it, ``stop()`` ends it; ``handle``
    takes one event (what the subscription calls). One console can watch several buses."""

    #: Whether pools alive at the same time share this console (a terminal holds one live
    #: view); False: each pool gets its own.
    one_view = True

    def __init__(self) -> None:
        self.view = PoolView()
        self._subscriptions: list[Subscription] = []
        self._lock = threading.RLock()
        self._running = False

    def start(self, bus: EventBus | None = None) -> Console:
        """Begin rendering; with ``bus``, also subscribe to all of its events. Returns self."""
        if not self._running:
            self._running = True
            self._begin()
        if bus is not None:
            self.attach(bus)
        return self

    def attach(self, bus: EventBus) -> Subscription:
        """Render ``bus``'s events too; cancel the returned subscription to stop.

        A summary subscription: task counts come from ``TaskProgress``, so the pool builds no
        per-task events for a console.
        """
        subscription = bus.subscribe(self.handle, summary=True)
        self._subscriptions.append(subscription)
        return subscription

    def stop(self) -> None:
        """Unsubscribe from every bus and finish rendering; idempotent."""
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            subscription.cancel()
        if self._running:
            self._running = False
            self._end()

    def _begin(self) -> None:
        pass

    def _end(self) -> None:
        pass

    def handle(self, event: Event) -> None:
        """Fold ``event`` into the view and render what it changes."""
        with self._lock:
            view = self.view.apply(event)
            self._render(event, view)

    def _render(self, event: Event, view: StackView | None) -> None:
        pass

    def __enter__(self) -> Console:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SilentConsole(Console):
    """Shows nothing (events still reach ``on_event`` callbacks and the log file)."""


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

def short_stack(stack: str) -> str:
    """The random suffix that tells a stack apart (``local-root-2026...-f55305`` -> f55305)."""
    return stack.rsplit("-", 1)[-1] if stack.count("-") >= 2 else stack


def seconds(value: float) -> str:
    """``0.4s``, ``12.3s``, ``5m12s``, ``2h03m``."""
    if value < 60:
        return f"{value:.1f}s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def usd(value: float) -> str:
    """Dollars: cents from $0.10, four decimals below (a short run costs fractions of a cent)."""
    return f"${value:,.2f}" if value == 0 or value >= 0.1 else f"${value:.4f}"


def size(value: float) -> str:
    """Bytes as ``512 MB``/``1.5 GB``."""
    for unit, scale in (("TB", 1024**4), ("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def changes(counts: dict[str, int] | object) -> str:
    """``{"create": 3, "same": 1}`` -> ``3 created, 1 unchanged``."""
    words = {"create": "created", "update": "updated", "delete": "deleted", "same": "unchanged",
             "replace": "replaced", "create-replacement": "replacement created",
             "delete-replaced": "replaced deleted", "read": "read", "refresh": "refreshed"}
    items = counts.items() if isinstance(counts, dict) else ()
    parts = [f"{n} {words.get(op, op)}" for op, n in items if n]
    return ", ".join(parts) or "no changes"


def metrics_summary(metrics: dict[str, float]) -> str:
    """The node metrics worth a glance: ``cpu 12% mem 31% gpu 80% gpu-mem 3.1 GB``."""
    parts = []
    for name, label in (("cpu", "cpu"), ("memory", "mem"), ("gpu", "gpu"), ("disk", "disk")):
        if name in metrics:
            parts.append(f"{label} {metrics[name]:.0f}%")
    if "gpu_memory" in metrics:
        parts.append(f"gpu-mem {size(metrics['gpu_memory'])}")
    if "network_rx" in metrics or "network_tx" in metrics:
        parts.append(f"net {size(metrics.get('network_rx', 0))}/s in "
                     f"{size(metrics.get('network_tx', 0))}/s out")
    known = {"cpu", "memory", "gpu", "disk", "gpu_memory", "network_rx", "network_tx",
             "memory_used", "memory_total", "gpu_memory_total", "gpu_temp"}
    parts += [f"{name} {value:g}" for name, value in metrics.items()
              if name not in known and not name.startswith("disk:")]
    return " ".join(parts)
