"""The consoles: log lines when piped, the rich live view under a real pseudo-terminal."""

from __future__ import annotations

import fcntl
import io
import os
import re
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path

import pytest

from skyward_iac.api.errors import ConfigError
from skyward_iac.observability import events as ev
from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.console import (
    SilentConsole,
    acquire_console,
    changes,
    console_for,
    seconds,
    usd,
)
from skyward_iac.observability.console_log import LogConsole, MinimalConsole
from skyward_iac.observability.view import PoolView

S = "local-root-20260101-000000-abcdef"
CLOCK = re.compile(r"^\d\d:\d\d:\d\d ")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

#: A scripted pool: provisioning, bootstrap, a task, teardown; DELAY seconds between steps.
FEED = textwrap.dedent("""
    import sys, time
    from skyward_iac.observability import events as ev
    from skyward_iac.observability.bus import EventBus
    from skyward_iac.observability.console import console_for
    mode = {"True": True, "False": False}.get(sys.argv[1], sys.argv[1])
    delay = float(sys.argv[2])
    S = "local-root-20260101-000000-abcdef"
    bus = EventBus()
    console = console_for(mode).start(bus)
    bus.emit(ev.ClusterRequested(S, "aws", 2, accelerator="L4", instance_type="g6.xlarge",
                                 market="spot", hourly_usd=0.9))
    for i in range(2):
        bus.emit(ev.StackProgress(S, "up", f"node-{i}", "aws:ec2/instance:Instance", "create",
                                  "started", i, i + 1, 4))
        bus.emit(ev.InstanceLaunched(S, i, instance_type="g6.xlarge"))
        time.sleep(delay)
        bus.emit(ev.StackProgress(S, "up", f"node-{i}", "aws:ec2/instance:Instance", "create",
                                  "completed", i + 1, i + 1, 4))
        bus.emit(ev.InstanceProvisioned(S, i, instance_id=f"i-{i}", address=f"10.0.0.{i}"))
        time.sleep(delay)
    bus.emit(ev.StackUpdated(S, {"create": 4}, 2.5))
    bus.emit(ev.ClusterProvisioned(S, 2, 2.5))
    for i in range(2):
        for k, phase in enumerate(["venv", "packages", "agent"]):
            bus.emit(ev.BootstrapPhase(S, i, phase, "started", index=k, total=3))
            bus.emit(ev.BootstrapConsole(S, i, f"{phase}: working (api_key=hunter2)"))
            time.sleep(delay)
            bus.emit(ev.BootstrapPhase(S, i, phase, "completed", index=k, total=3, duration=0.2))
        bus.emit(ev.InstanceBootstrapped(S, i, 1.1))
    bus.emit(ev.ClusterReady(S, 2, 4.0, 0.9))
    bus.emit(ev.Metric(S, 0, "cpu", 42.0, "%"))
    # What a pool emits: per-task events (a console, a summary subscriber, skips them) and
    # the counts.
    bus.emit(ev.TaskQueued(S, 1, "train"))
    bus.emit(ev.TaskStarted(S, 1, "train", 0))
    bus.emit(ev.TaskProgress(S, 0, 1, 0, 0))
    print("user result 42", flush=True)  # a task's output, on stdout
    time.sleep(delay)
    bus.emit(ev.TaskCompleted(S, 1, "train", 0, True, 0.7))
    bus.emit(ev.TaskProgress(S, 0, 0, 1, 0))
    time.sleep(delay)
    bus.emit(ev.StackDestroyed(S, 4, {"delete": 4}, 1.0))
    bus.emit(ev.ClusterDestroyed(S, 1.0, uptime=60.0, cost_usd=0.015))
    console.stop()
    print("FEED DONE", file=sys.stderr, flush=True)
""")


def run_piped(mode: str, tmp_path: Path) -> list[str]:
    script = tmp_path / "feed.py"
    script.write_text(FEED)
    done = subprocess.run([sys.executable, str(script), mode, "0"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "TERM": "xterm-256color"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "user result 42\n", "stdout is the program's, not the console's"
    return done.stderr.splitlines()[:-1]


def test_default_console_writes_plain_timestamped_lines_when_piped(tmp_path: Path) -> None:
    lines = run_piped("True", tmp_path)
    assert lines and all(CLOCK.match(line) for line in lines), lines
    assert not any(ANSI.search(line) for line in lines)
    text = "\n".join(line[9:] for line in lines)
    for expected in (
        f"stack {S}: requesting 2 node(s) on aws (L4, g6.xlarge, spot), $0.90/h",
        "pulumi up [1/4] create node-0 (Instance)",
        "node 1: launching (g6.xlarge)",
        "node 0: provisioned at 10.0.0.0",
        "pulumi up done in 2.5s: 4 created",
        "node 1: bootstrap [2/3] packages",
        "node 1: bootstrap packages done in 0.2s",
        "node 0: ready in 1.1s",
        f"pool {S} ready: 2 node(s) in 4.0s, $0.90/h",
        "node 0: cpu 42%",
        "tasks: 0 queued, 1 running, 0 done, 0 failed",
        "tasks: 0 queued, 0 running, 1 done, 0 failed",
        "pulumi destroy done in 1.0s: 4 resource(s) deleted",
        f"stack {S} destroyed in 1.0s; up 1m00s, cost $0.0150",
    ):
        assert expected in text, f"{expected!r} not in:\n{text}"
    assert "hunter2" not in text


def test_rich_on_a_pipe_falls_back_to_log_lines(tmp_path: Path) -> None:
    assert run_piped("rich", tmp_path) and all(
        CLOCK.match(line) and not ANSI.search(line) for line in run_piped("rich", tmp_path))


def test_minimal_shows_milestones_only_and_silent_nothing(tmp_path: Path) -> None:
    minimal = [line[9:] for line in run_piped("minimal", tmp_path)]
    assert [line.split(":")[0].split(" ")[0] for line in minimal] == ["stack", "pool", "stack"]
    assert run_piped("silent", tmp_path) == [] and run_piped("False", tmp_path) == []


def test_console_for_modes() -> None:
    piped = io.StringIO()
    assert type(console_for(True, piped)) is LogConsole
    assert type(console_for("rich", piped)) is LogConsole
    assert type(console_for("log", piped)) is LogConsole
    assert type(console_for("minimal", piped)) is MinimalConsole
    assert type(console_for("silent", piped)) is SilentConsole
    assert type(console_for(False, piped)) is SilentConsole
    with pytest.raises(ConfigError, match="'rich', 'log', 'minimal', 'silent'"):
        console_for("fancy", piped)


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_dumb_terminal_gets_log_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "dumb")
    assert type(console_for(True, Tty())) is LogConsole
    monkeypatch.setenv("TERM", "xterm")
    assert type(console_for(True, Tty())).__name__ == "RichConsole"


def lines_of(console: LogConsole, *events: ev.Event) -> list[str]:
    for event in events:
        console.handle(event)
    stream = console.stream
    assert isinstance(stream, io.StringIO)
    return [line[9:] for line in stream.getvalue().splitlines()]


def test_log_console_redacts_and_throttles_metrics() -> None:
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAAB3Nz\n-----END OPENSSH PRIVATE KEY-----"
    lines = lines_of(
        LogConsole(io.StringIO()),
        ev.BootstrapPhase(S, 0, "agent", "failed", detail=f"bad key {pem}"),
        ev.Metric(S, 0, "cpu", 10.0, timestamp=100.0),
        ev.Metric(S, 0, "memory", 20.0, timestamp=101.0),
        ev.Metric(S, 0, "cpu", 30.0, timestamp=131.0),
        ev.Log(S, "task output", node=0),
    )
    assert lines[0].startswith("node 0: bootstrap agent FAILED: bad key -----BEGIN OPENSSH")
    assert "AAAAB3Nz" not in "\n".join(lines)
    assert lines[-2:] == ["node 0: cpu 10%", "node 0: cpu 30% mem 20%"]
    shown = lines_of(LogConsole(io.StringIO(), show_logs=True), ev.Log(S, "out", node=1))
    assert shown == ["[node 1] out"]


def test_log_console_prints_task_counts_every_few_seconds_and_always_failures() -> None:
    from skyward_iac.observability.console_log import PROGRESS_EVERY

    events: list[ev.Event] = [ev.ClusterRequested(S, "local", 1, timestamp=99.0)]
    # Four reports a second for 2 * PROGRESS_EVERY seconds while 80 tasks move.
    for step in range(int(8 * PROGRESS_EVERY)):
        done = step * 2
        events.append(ev.TaskProgress(S, max(0, 78 - done), 2, done, 0,
                                      timestamp=100.0 + step / 4))
    events.append(ev.TaskCompleted(S, 99, "f", 0, False, 0.5, error="ValueError: x",
                                   timestamp=110.1))
    events.append(ev.TaskProgress(S, 0, 0, 79, 1, timestamp=110.2))  # all done: printed
    events.append(ev.TaskProgress(S, 0, 0, 79, 1, timestamp=110.3))  # the same counts: not
    lines = lines_of(LogConsole(io.StringIO()), *events)[1:]
    assert lines == [
        "tasks: 78 queued, 2 running, 0 done, 0 failed",
        f"tasks: {78 - 8 * int(PROGRESS_EVERY)} queued, 2 running, {8 * int(PROGRESS_EVERY)} "
        "done, 0 failed",
        "task 99 f FAILED on node 0 after 0.5s: ValueError: x",
        "tasks: 0 queued, 0 running, 79 done, 1 failed",
    ]


def test_a_failed_task_line_says_how_long_it_was_out_or_that_it_never_left() -> None:
    """Issue 29 item 9: a timed-out task said "after 0.0s"; a call that never reached a node
    said "on node -1 after 0.0s"."""
    lines = lines_of(
        LogConsole(io.StringIO()), ev.ClusterRequested(S, "local", 1),
        ev.TaskCompleted(S, 7, "slow", 1, False, 3.02, error="TimeoutError: slow did not finish"),
        ev.TaskCompleted(S, 8, "late", -1, False, 0.0, error="NodeConnectionError: pool closed"))
    assert lines[1:] == [
        "task 7 slow FAILED on node 1 after 3.0s: TimeoutError: slow did not finish",
        "task 8 late FAILED before reaching a node: NodeConnectionError: pool closed"]


def test_log_console_needs_no_per_task_events() -> None:
    """A console subscribes as a summary: the bus keeps per-task events from it, and the pool
    builds them only for someone else."""
    bus = EventBus()
    stream = io.StringIO()
    console = LogConsole(stream).start(bus)
    assert len(bus) == 1 and not bus.task_detail
    bus.emit(ev.TaskQueued(S, 1, "f"))
    bus.emit(ev.TaskStarted(S, 1, "f", 0))
    bus.emit(ev.TaskCompleted(S, 1, "f", 0, True, 0.1))
    assert stream.getvalue() == "" and console.view.stacks == {}
    bus.emit(ev.TaskCompleted(S, 2, "f", 0, False, 0.1, error="KeyError: 'k'"))
    assert stream.getvalue().endswith("task 2 f FAILED on node 0 after 0.1s: KeyError: 'k'\n")
    console.stop()


def test_log_console_prefixes_lines_when_several_pools_run() -> None:
    other = "aws-root-20260101-000000-123456"
    lines = lines_of(LogConsole(io.StringIO()), ev.ClusterRequested(S, "local", 1),
                     ev.ClusterRequested(other, "aws", 1), ev.InstanceLaunched(S, 0))
    assert lines[-1] == "[abcdef] node 0: launching"


def test_pools_alive_together_share_one_console() -> None:
    stream = io.StringIO()
    first, second = EventBus(), EventBus()
    release_first = acquire_console("log", first, stream)
    release_second = acquire_console("log", second, stream)
    first.emit(ev.ClusterRequested(S, "local", 1))
    second.emit(ev.ClusterRequested("aws-x-1-222222", "aws", 1))
    second.emit(ev.InstanceLaunched("aws-x-1-222222", 0))
    release_first()
    release_first()  # idempotent
    first.emit(ev.InstanceLaunched(S, 0))
    second.emit(ev.InstanceLaunched("aws-x-1-222222", 1))
    release_second()
    second.emit(ev.InstanceLaunched("aws-x-1-222222", 2))
    lines = [line[9:] for line in stream.getvalue().splitlines()]
    assert lines[2:] == ["[222222] node 0: launching", "[222222] node 1: launching"]
    assert len(first) == len(second) == 0


def test_one_live_view_for_several_rich_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    terminal = Tty()
    buses = [EventBus(), EventBus()]
    # rich allows one live display at a time: a second would raise LiveError.
    releases = [acquire_console(True, bus, terminal) for bus in buses]
    buses[0].emit(ev.ClusterRequested(S, "local", 1))
    buses[1].emit(ev.ClusterRequested("aws-x-1-222222", "aws", 2))
    for release in releases:
        release()
    drawn = ANSI.sub("", terminal.getvalue())
    assert S in drawn and "aws-x-1-222222" in drawn and "0/2 ready" in drawn


def test_rich_console_shows_task_counts_from_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console as Terminal

    monkeypatch.setenv("TERM", "xterm-256color")
    bus = EventBus()
    console = console_for(True, Tty())
    console.attach(bus)
    bus.emit(ev.ClusterRequested(S, "local", 1))
    bus.emit(ev.TaskQueued(S, 1, "f"))  # not the console's: the counts come from progress
    bus.emit(ev.TaskProgress(S, 4, 2, 0, 0))
    picture = Terminal(record=True, width=130, file=io.StringIO())
    picture.print(console.renderable())  # type: ignore[attr-defined]
    assert "4 queued · 2 running · 0 done · 0 failed" in picture.export_text()
    console.stop()


def test_a_closed_stream_does_not_break_the_pool() -> None:
    stream = io.StringIO()
    console = LogConsole(stream)
    stream.close()
    console.handle(ev.ClusterReady(S, 1, 1.0))


def test_pool_view_tracks_progress_tasks_and_cost() -> None:
    view = PoolView()
    view.apply(ev.ClusterRequested(S, "aws", 2, hourly_usd=3.6, timestamp=1000.0))
    stack = view.stacks[S]
    assert [n.progress for n in stack.nodes.values()] == [0.0, 0.0]
    view.apply(ev.InstanceLaunched(S, 0, timestamp=1000.0))
    view.apply(ev.InstanceProvisioned(S, 0))
    assert stack.nodes[0].progress == 0.25
    view.apply(ev.BootstrapPhase(S, 0, "venv", "started", index=0, total=2))
    view.apply(ev.BootstrapPhase(S, 0, "venv", "completed", index=0, total=2))
    assert stack.nodes[0].progress == pytest.approx(0.25 + 0.75 / 2)
    view.apply(ev.InstanceBootstrapped(S, 0, 1.0))
    assert stack.nodes[0].progress == 1.0 and stack.ready_nodes == 1
    view.apply(ev.TaskProgress(S, 4, 2, 0, 0))
    view.apply(ev.TaskCompleted(S, 1, "f", 0, False, 1.0, "x"))  # counted by the next progress
    assert (stack.queued, stack.running, stack.succeeded, stack.failed) == (4, 2, 0, 0)
    view.apply(ev.TaskProgress(S, 1, 2, 2, 1))
    assert (stack.queued, stack.running, stack.succeeded, stack.failed) == (1, 2, 2, 1)
    view.apply(ev.Metric(S, 0, "gpu", 40.0, device=0))
    view.apply(ev.Metric(S, 0, "gpu", 80.0, device=1))
    assert stack.nodes[0].metrics["gpu"] == 60.0
    assert stack.cost(now=1000.0 + 1800) == pytest.approx(1.8)
    view.apply(ev.ClusterDestroyed(S, 1.0, timestamp=1000.0 + 3600))
    assert stack.cost(now=10**9) == pytest.approx(3.6) and view.active() == []


def test_formatting_helpers() -> None:
    assert [seconds(0.42), seconds(75), seconds(7380)] == ["0.4s", "1m15s", "2h03m"]
    assert [usd(0), usd(0.0123), usd(12.5)] == ["$0.00", "$0.0123", "$12.50"]
    assert changes({"create": 3, "same": 1, "delete": 0}) == "3 created, 1 unchanged"


# ---- the rich console under a pseudo-terminal --------------------------------------------

class Pty:
    """A child process whose stdin/stdout/stderr are a real pseudo-terminal (130x40), read
    with pexpect. Started with subprocess, not pexpect.spawn: forking this test process in
    Python (it has loaded gRPC with the engine tests) can wedge the child before its exec."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        fdpexpect = pytest.importorskip("pexpect.fdpexpect")
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 130, 0, 0))
        self.process = subprocess.Popen(
            [sys.executable, *args], stdin=slave, stdout=slave, stderr=slave,
            start_new_session=True, env={**os.environ, "TERM": "xterm-256color",
                                         "COLUMNS": "130", "LINES": "40", **(env or {})})
        os.close(slave)
        self.reader = fdpexpect.fdspawn(master, encoding="utf-8", timeout=60)

    def expect(self, pattern: str) -> None:
        self.reader.expect(pattern)

    @property
    def before(self) -> str:
        return str(self.reader.before)

    def finish(self) -> int:
        """Read to the end and return the exit status."""
        self.reader.expect(pytest.importorskip("pexpect").EOF)
        self.reader.close()
        return self.process.wait(timeout=30)


def spawn(args: list[str], env: dict[str, str] | None = None) -> Pty:
    return Pty(args, env)


def test_rich_console_shows_progress_while_provisioning(tmp_path: Path) -> None:
    script = tmp_path / "feed.py"
    script.write_text(FEED)
    child = spawn([str(script), "True", "0.3"])
    # Each expect consumes the output up to its match, so the order is checked too.
    child.expect(r"pulumi up[^\n]*━")                  # the resource bar is drawn ...
    child.expect(r"node 1[^\n]*━[^\n]*(launching|provisioned)")  # ... and a bar per node
    child.expect(r"\d/4 resources")
    child.expect(r"bootstrap (venv|packages|agent) \(\d/3\)")  # bootstrap phases as progress
    before_ready = child.before
    child.expect("ready: 2 node\\(s\\) in 4.0s")       # the milestone line, after the bars
    assert "$0.90/h" in before_ready and "so far" in before_ready
    child.expect(r"tasks[^\n]*queued · \d running · \d done")
    child.expect("destroyed in 1.0s")
    child.expect("FEED DONE")
    assert child.finish() == 0
    transcript = ANSI.sub("", before_ready)
    assert "hunter2" not in transcript
    assert "\x1b[" in before_ready, "a terminal gets a redrawn, colored view"


def test_rich_console_leaves_redirected_stdout_in_its_file(tmp_path: Path) -> None:
    script = tmp_path / "feed.py"
    script.write_text(FEED)
    out = tmp_path / "out.txt"
    child = spawn(["-c", f"import runpy, sys; sys.argv = ['feed', 'True', '0.05']; "
                         f"sys.stdout = open({str(out)!r}, 'w', buffering=1); "
                         f"runpy.run_path({str(script)!r}, run_name='__main__')"])
    child.expect(r"pool [^\n]* ready")  # the rich console drew on the terminal
    child.expect("FEED DONE")
    transcript = child.before
    assert child.finish() == 0
    assert out.read_text() == "user result 42\n"
    assert "user result 42" not in transcript


FEED_ENGINE = textwrap.dedent("""
    import sys
    import pulumi, pulumi.automation as auto
    from skyward_iac.infra.engine import locate as engine
    from skyward_iac.observability import events as ev
    from skyward_iac.observability.bus import EventBus
    from skyward_iac.observability.console import console_for
    from skyward_iac.observability.engine_events import EngineEventTranslator

    work = sys.argv[1]
    found = engine.find_engine()
    def program():
        for i in range(3):
            node = pulumi.ComponentResource("skyward:test:Node", f"node-{i}")
            for d in range(3):
                pulumi.ComponentResource("skyward:test:Disk", f"node-{i}-disk-{d}",
                                         opts=pulumi.ResourceOptions(parent=node))
            node.register_outputs({"address": f"127.0.0.{i + 2}"})
    url = f"file://{work}/state"
    stack = auto.create_stack("console", project_name="obs", program=program,
        opts=auto.LocalWorkspaceOptions(work_dir=work,
            pulumi_command=auto.PulumiCommand(root=str(found.root)),
            env_vars={**engine.engine_env(found), "PULUMI_BACKEND_URL": url},
            project_settings=auto.ProjectSettings(name="obs", runtime="python",
                backend=auto.ProjectBackend(url=url))))
    bus = EventBus()
    console = console_for(True).start(bus)
    bus.emit(ev.ClusterRequested("console", "local", 3))
    stack.up(on_event=EngineEventTranslator("console", "up", bus.emit), color="never",
             on_output=lambda line: None)
    stack.destroy(on_event=EngineEventTranslator("console", "destroy", bus.emit),
                  color="never", on_output=lambda line: None)
    console.stop()
    print("ENGINE DONE", file=sys.stderr, flush=True)
""")


@pytest.mark.integration
def test_rich_console_shows_a_real_pulumi_up_as_progress(tmp_path: Path) -> None:
    from skyward_iac.infra.engine import locate as engine

    try:
        engine.find_engine()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no Pulumi engine: {exc}")
    (tmp_path / "state").mkdir()
    script = tmp_path / "engine_feed.py"
    script.write_text(FEED_ENGINE)
    child = spawn([str(script), str(tmp_path)])
    child.expect(r"node 2[^\n]*━")
    child.expect(r"pulumi up done in [\d.]+s: 12 created")
    child.expect(r"pulumi destroy done in [\d.]+s: 12 resource\(s\) deleted")
    child.expect("ENGINE DONE")
    output = ANSI.sub("", child.before)
    assert child.finish() == 0
    assert "Updating (console)" not in output, "the engine's own output is not dumped"
    assert "Resources:" not in output


def test_destroyed_line_falls_back_to_the_view_for_uptime_and_cost() -> None:
    lines = lines_of(LogConsole(io.StringIO()),
                     ev.ClusterRequested(S, "aws", 1, hourly_usd=36.0, timestamp=1000.0),
                     ev.InstanceLaunched(S, 0, timestamp=1000.0),
                     ev.ClusterDestroyed(S, 2.0, timestamp=1090.0))
    assert lines[-1] == f"stack {S} destroyed in 2.0s; up 1m30s, cost $0.90"
