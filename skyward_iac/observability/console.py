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
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, TextIO

from skyward_iac.api.errors import ConfigError
from skyward_iac.observability.events import (
    Event,
)
from skyward_iac.observability.streams import track_streams
from skyward_iac.observability.view import PoolView, StackView

if TYPE_CHECKING:
    from skyward_iac.observability.bus import EventBus, Subscription

ConsoleMode = Literal["rich", "log", "minimal", "silent"]
MODES: tuple[str, ...] = ("rich", "log", "minimal", "silent")
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
    from skyward_iac.observability.console_log import LogConsole, MinimalConsole

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
