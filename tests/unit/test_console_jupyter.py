"""The Jupyter console's display: HTML and plain text of the same view, no escape codes, secrets
redacted, a bounded number of lines. (In a real kernel: tests/integration/test_notebook.py.)"""

from __future__ import annotations

import html
import re
import threading
import time

import pytest

from skyward_iac.observability import console as console_module
from skyward_iac.observability import events as ev
from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.console import console_for, in_jupyter_kernel
from skyward_iac.observability.console_log import LogConsole
from skyward_iac.observability.console_rich import JupyterConsole

S = "local-root-20260101-000000-abcdef"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def provisioning(console: JupyterConsole) -> None:
    console.handle(ev.ClusterRequested(S, "aws", 2, instance_type="g6.xlarge", market="spot",
                                       hourly_usd=0.9))
    for node in range(2):
        console.handle(ev.InstanceLaunched(S, node, instance_type="g6.xlarge"))
        console.handle(ev.BootstrapPhase(S, node, "packages", "started", index=1, total=3))
        console.handle(ev.BootstrapConsole(S, node, "pip install <x> token=hunter2"))


def test_the_display_is_html_and_plain_text_of_the_live_view() -> None:
    console = JupyterConsole()
    provisioning(console)
    bundle = console.bundle()
    plain, markup = bundle["text/plain"], bundle["text/html"]
    assert f"stack {S}: requesting 2 node(s) on aws (g6.xlarge, spot), $0.90/h" in plain
    assert "bootstrap packages (1/3)" in plain and "node 1" in plain  # the panel, per node
    assert markup.startswith("<pre") and "<span style=" in markup  # Rich's colours, inline
    assert html.unescape(re.sub(r"<[^>]+>", "", markup)).strip() == plain.strip()
    assert not ANSI.search(plain) and not ANSI.search(markup)
    assert "hunter2" not in plain and "hunter2" not in markup
    assert "<x>" not in markup  # text is escaped, never taken as HTML


def test_once_the_pool_is_gone_the_display_keeps_its_milestones() -> None:
    console = JupyterConsole()
    provisioning(console)
    console.handle(ev.ClusterReady(S, 2, 4.0, 0.9))
    console.handle(ev.ClusterDestroyed(S, 1.0, uptime=60.0, cost_usd=0.015))
    lines = console.bundle()["text/plain"].splitlines()
    assert [line[9:] for line in lines] == [
        f"stack {S}: requesting 2 node(s) on aws (g6.xlarge, spot), $0.90/h",
        f"pool {S} ready: 2 node(s) in 4.0s, $0.90/h",
        f"stack {S} destroyed in 1.0s; up 1m00s, cost $0.0150",
    ]


def test_lines_beyond_the_limit_are_dropped_and_counted() -> None:
    console = JupyterConsole(show_logs=True)
    for i in range(JupyterConsole.MAX_LINES + 5):
        console.handle(ev.Log(S, f"line {i}", node=0))
    lines = [line for line in console.bundle()["text/plain"].splitlines()
             if "[node 0]" in line or "earlier" in line]  # the panel below left out
    assert len(lines) == JupyterConsole.MAX_LINES + 1
    assert lines[0] == "... 5 earlier line(s)"
    assert lines[1].endswith("[node 0] line 5") and lines[-1].endswith(
        f"[node 0] line {JupyterConsole.MAX_LINES + 4}")


def test_outside_a_kernel_the_console_is_not_the_jupyter_one() -> None:
    assert not in_jupyter_kernel()
    assert type(console_for(True)) is LogConsole  # pytest's stderr is no terminal
    assert type(console_for("rich")) is LogConsole


class Display:
    """Stands in for IPython's DisplayHandle: records each redraw."""

    def __init__(self) -> None:
        self.updates: list[dict[str, str]] = []

    def update(self, bundle: dict[str, str], raw: bool) -> None:
        self.updates.append(bundle)


def test_metrics_alone_redraw_rarely_anything_else_at_once() -> None:
    console = JupyterConsole(refresh_per_second=20)
    console.METRICS_REFRESH = 1.0
    display = console._display = Display()
    refresher = threading.Thread(target=console._refresh, daemon=True)
    refresher.start()
    try:
        provisioning(console)
        time.sleep(0.5)
        assert 1 <= len(display.updates) <= 2  # the events above, drawn together
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:  # a node's metrics, 20 times a second
            console.handle(ev.Metric(S, 0, "cpu", 42.0, "%"))
            time.sleep(0.05)
        assert 2 <= len(display.updates) <= 5, len(display.updates)  # + about once a second
        before = len(display.updates)
        console.handle(ev.ClusterReady(S, 2, 4.0, 0.9))
        time.sleep(0.5)
        assert len(display.updates) in (before + 1, before + 2)
        assert "ready: 2 node(s)" in display.updates[-1]["text/plain"]
    finally:
        console._stopped.set()
        refresher.join(timeout=5)


class QuietJupyterConsole(JupyterConsole):
    """The Jupyter console without a kernel to display in: counts its starts and stops."""

    started = stopped = 0

    def _begin(self) -> None:
        type(self).started += 1

    def _end(self) -> None:
        type(self).stopped += 1


def test_in_a_notebook_each_pool_gets_its_own_display(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console_module, "console_for",
                        lambda mode, stream=None, show_logs=False: QuietJupyterConsole())
    first, second = EventBus(), EventBus()
    release_first = console_module.acquire_console(True, first)
    release_second = console_module.acquire_console(True, second)
    assert QuietJupyterConsole.started == 2  # a terminal's console would be shared: 1
    release_first()
    assert QuietJupyterConsole.stopped == 1
    release_second()
    assert QuietJupyterConsole.stopped == 2
