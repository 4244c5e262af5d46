"""The ``"rich"`` console: a live view of each pool, redrawn in place on a terminal.

One panel per pool: the Pulumi operation's resource bar, a bar per node (launch -> provision
-> bootstrap phases -> ready) with its current phase, last bootstrap line or metrics, the task
counts, and in the subtitle nodes ready, USD/hour, cost so far and elapsed time. Milestones
and failures are also printed above the view as permanent lines, so they stay in the
scrollback after it is gone. Imported only when that console is chosen.

In a Jupyter kernel the same view is a display in the cell (``JupyterConsole``): HTML with
a plain-text twin, updated in place by display id, so it never shows escape codes and the saved
notebook keeps it as it was last drawn.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from typing import Any, TextIO

from rich.console import Console as Terminal
from rich.console import Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from skyward_iac.observability.console import (
    Console,
    changes,
    is_terminal,
    metrics_summary,
    seconds,
    usd,
)
from skyward_iac.observability.console_log import LogConsole
from skyward_iac.observability.events import (
    BootstrapPhase,
    ClusterDestroyed,
    ClusterReady,
    ClusterRequested,
    Error,
    Event,
    InstancePreempted,
    InstanceReplaced,
    Log,
    Metric,
    StackDestroyed,
    StackUpdated,
    TaskCompleted,
)
from skyward_iac.observability.logging import redact
from skyward_iac.observability.streams import end_open_line, raw
from skyward_iac.observability.view import NodeView, StackView

log = logging.getLogger("skyward")
BAR_WIDTH = 28
#: How the Jupyter display wraps Rich's HTML: a scrollable monospace block, as Rich's own
#: Jupyter output looks.
JUPYTER_HTML = ('<pre style="white-space:pre;overflow-x:auto;line-height:normal;'
                "font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace\">"
                "{code}</pre>")
_STATUS_STYLE = {"ready": "green", "failed": "red", "gone": "dim", "bootstrapping": "yellow",
                 "launching": "cyan", "provisioned": "cyan", "waiting": "dim"}


def stamped_lines(event: Event, line: str | None) -> list[str]:
    """A permanent line as printed: ``HH:MM:SS`` of the event before each of its lines,
    secrets redacted (none for None)."""
    if line is None:
        return []
    clock = time.strftime("%H:%M:%S", time.localtime(event.timestamp))
    return [f"{clock} {part}" for part in redact(line).splitlines()]


class RichConsole(Console):
    """A live, redrawn view on a terminal, plus permanent lines for milestones and failures."""

    _PRINTED = (ClusterRequested, ClusterReady, ClusterDestroyed, StackUpdated, StackDestroyed,
                Error, InstancePreempted, InstanceReplaced, Log)

    def __init__(self, stream: TextIO, *, show_logs: bool = False,
                 refresh_per_second: float = 4) -> None:
        super().__init__()
        self.stream = stream
        # Rich writes to the terminal itself, past the line tracking of ``streams.py``: while
        # the view is up, the user's prints reach it through Rich's own line-buffered proxies.
        self.terminal = Terminal(file=raw(stream), highlight=False)
        # The log console's wording, reused for the permanent lines.
        self._lines = LogConsole(stream, show_logs=show_logs)
        # Output written while the view is up must be printed above it, or it tears the view;
        # but stdout redirected to a file (`python run.py > out`) has to stay in that file.
        self._live = Live(get_renderable=self._renderable, console=self.terminal,
                          refresh_per_second=refresh_per_second, transient=False,
                          redirect_stdout=is_terminal(sys.stdout),
                          redirect_stderr=stream is sys.stderr)

    def _begin(self) -> None:
        end_open_line(self.stream)  # the view starts on a line of its own
        self._live.start()

    def _end(self) -> None:
        """Draw the final state and leave it on screen."""
        self._live.stop()

    def handle(self, event: Event) -> None:
        # The line is printed outside our lock: printing takes the Live's lock, and the Live's
        # refresh thread holds that one while it asks for our renderable (which takes ours).
        with self._lock:
            view = self.view.apply(event)
            line = self._line(event, view)
        for stamped in stamped_lines(event, line):
            self.terminal.print(Text(stamped), soft_wrap=True)

    def _line(self, event: Event, view: StackView | None) -> str | None:
        failed = (isinstance(event, BootstrapPhase) and event.status == "failed") or (
            isinstance(event, TaskCompleted) and not event.success)
        if isinstance(event, self._PRINTED) or failed:
            return self._lines.describe(event, view)
        return None

    # ---- drawing ------------------------------------------------------------------------

    def renderable(self) -> RenderableType:
        """The live view as it is now (for a picture of it, or a test)."""
        return self._renderable()

    def _renderable(self) -> RenderableType:
        with self._lock:
            now = time.time()
            return Group(*(self._panel(stack, now) for stack in self.view.active()))

    def _panel(self, stack: StackView, now: float) -> Panel:
        grid = Table.grid(padding=(0, 1), expand=True)
        grid.add_column(width=14, no_wrap=True)
        grid.add_column(width=BAR_WIDTH, no_wrap=True)
        grid.add_column(width=26, no_wrap=True)
        grid.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        if stack.operation:
            total = stack.steps_total or max(stack.steps_started, 1)
            finished = stack.resources is not None and stack.steps_done >= stack.steps_started
            grid.add_row(
                Text(f"pulumi {stack.operation}", style="bold"),
                ProgressBar(total=total, completed=total if finished else stack.steps_done,
                            width=BAR_WIDTH),
                Text(f"done: {changes(stack.changes)}" if finished
                     else f"{stack.steps_done}/{total} resources"),
                Text(stack.last_resource, style="dim"),
            )
        for index in sorted(stack.nodes):
            grid.add_row(*self._node_row(stack.nodes[index]))
        rows: list[RenderableType] = [grid]
        if stack.state in ("ready", "destroying") or stack.queued or stack.running:
            rows.append(Text.assemble(
                ("tasks          ", "bold"), f"{stack.queued} queued · {stack.running} running · "
                f"{stack.succeeded} done · ", (f"{stack.failed} failed",
                                               "red" if stack.failed else "")))
        if stack.errors:
            rows.append(Text.assemble(("error          ", "bold red"),
                                      (redact(stack.errors[-1]), "red"), overflow="ellipsis",
                                      no_wrap=True))
        return Panel(Group(*rows), title=Text(stack.stack, style="bold"), title_align="left",
                     subtitle=Text(self._subtitle(stack, now)), subtitle_align="right")

    @staticmethod
    def _node_row(node: NodeView) -> tuple[RenderableType, ...]:
        status = node.status
        if status == "bootstrapping" and node.phase:
            total = f"/{node.phases_total}" if node.phases_total else ""
            status = f"bootstrap {node.phase} ({node.phases_done + 1}{total})"
        elif status == "failed" and node.phase:
            status = f"failed: {node.phase}"
        detail = metrics_summary(node.metrics) if node.status == "ready" else node.last_line
        return (
            Text(f"node {node.index}"),
            ProgressBar(total=100, completed=node.progress * 100, width=BAR_WIDTH,
                        complete_style=_STATUS_STYLE.get(node.status, "")),
            Text(status, style=_STATUS_STYLE.get(node.status, "")),
            Text(redact(detail), style="dim"),
        )

    @staticmethod
    def _subtitle(stack: StackView, now: float) -> str:
        kind = stack.instance_type if stack.instance_type != stack.provider else None
        what = " ".join(x for x in (stack.provider, stack.accelerator, kind, stack.market) if x)
        wanted = stack.wanted or len(stack.nodes)
        return (f"{what} · {stack.ready_nodes}/{wanted} ready · {usd(stack.hourly_usd)}/h · "
                f"{usd(stack.cost(now))} so far · {seconds(stack.elapsed(now))}")


class JupyterConsole(RichConsole):
    """``"rich"`` in a Jupyter kernel: the milestone lines and the live view as one display in
    the cell that opened the pool, redrawn in place (at most ``refresh_per_second``).

    The display carries ``text/html`` (Rich's colours as inline styles) and ``text/plain`` (for
    frontends and tools that show no HTML): no terminal escape codes either way. Updates go by
    display id, so the view stays current in that cell while later cells use the pool.
    """

    #: A notebook shows each pool's view in the cell that opened it.
    one_view = False
    #: Milestone lines kept in the display (the oldest are dropped, and counted).
    MAX_LINES = 200
    #: Metrics arrive every second for as long as a pool lives, idle or not: a change of them
    #: alone redraws the display this rarely, so an open pool does not stream HTML all day.
    METRICS_REFRESH = 10.0

    def __init__(self, *, show_logs: bool = False, refresh_per_second: float = 1,
                 width: int = 110) -> None:
        Console.__init__(self)  # no terminal and no Live: the display replaces both
        self._lines = LogConsole(io.StringIO(), show_logs=show_logs)  # the wording only
        self.width = width
        self._interval = 1 / refresh_per_second
        self._printed: list[str] = []
        self._dropped = 0
        self._changed = threading.Event()
        self._metrics_changed = threading.Event()
        self._stopped = threading.Event()
        self._display: Any = None
        self._refresher: threading.Thread | None = None

    def _begin(self) -> None:
        from IPython.display import display

        self._stopped.clear()
        # Shown in the cell running now: the display's parent is the caller's cell.
        self._display = display(self.bundle(), raw=True, display_id=True)
        self._refresher = threading.Thread(target=self._refresh, name="skyward-jupyter-console",
                                           daemon=True)
        self._refresher.start()

    def _end(self) -> None:
        self._stopped.set()
        if self._refresher is not None:
            self._refresher.join(timeout=5)
            self._refresher = None
        self._draw()  # the final state, kept in the saved notebook

    def handle(self, event: Event) -> None:
        with self._lock:
            view = self.view.apply(event)
            self._printed += stamped_lines(event, self._line(event, view))
            if len(self._printed) > self.MAX_LINES:
                self._dropped += len(self._printed) - self.MAX_LINES
                del self._printed[:-self.MAX_LINES]
        (self._metrics_changed if isinstance(event, Metric) else self._changed).set()

    def _refresh(self) -> None:
        drawn = time.monotonic()
        while not self._stopped.wait(self._interval):
            metrics_due = self._metrics_changed.is_set() \
                and time.monotonic() - drawn >= self.METRICS_REFRESH
            if self._changed.is_set() or metrics_due:
                self._changed.clear()
                self._metrics_changed.clear()
                self._draw()
                drawn = time.monotonic()

    def _draw(self) -> None:
        if self._display is not None:
            try:
                self._display.update(self.bundle(), raw=True)
            except Exception as exc:  # noqa: BLE001 - a closed channel must not break the pool
                log.debug("the Jupyter console could not redraw: %s", exc)

    def bundle(self) -> dict[str, str]:
        """The display as it is now: ``{"text/html": ..., "text/plain": ...}``."""
        terminal = Terminal(file=io.StringIO(), record=True, width=self.width,
                            force_terminal=True, force_jupyter=False, color_system="truecolor",
                            highlight=False)
        with self._lock:
            lines = ([f"... {self._dropped} earlier line(s)"] if self._dropped else []) \
                + self._printed
            for line in lines:
                terminal.print(Text(line), soft_wrap=True)
            if self.view.active():
                terminal.print(self._renderable())
        return {"text/plain": terminal.export_text(clear=False, styles=False).rstrip("\n"),
                "text/html": terminal.export_html(inline_styles=True, code_format=JUPYTER_HTML)}
