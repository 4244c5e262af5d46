"""Events are frozen values; the bus delivers them safely; engine events become progress."""

from __future__ import annotations

import dataclasses
import logging
import pickle
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from skyward_iac.observability import events as ev
from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.engine_events import EngineEventTranslator
from skyward_iac.orchestration.identity import PoolIdentity

S = "local-root-20260101-000000-abcdef"


def sample(cls: type[ev.Event]) -> ev.Event:
    """An instance of ``cls`` with a plausible value for every required field."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        values[f.name] = {"stack": S, "node": 0, "task_id": 1, "nodes": 2, "done": 1,
                          "started": 2, "deleted": 1, "success": True, "changes": {"create": 1},
                          "value": 1.5, "duration": 0.5, "status": "started", "operation": "up",
                          }.get(f.name, "x")
    return cls(**values)


def test_every_concrete_event_is_listed_and_exported() -> None:
    def subclasses(cls: type[ev.Event]) -> set[str]:  # by name: slots=True remakes a class
        return {name for child in cls.__subclasses__() if child.__module__ == ev.__name__
                for name in {child.__name__, *subclasses(child)}}

    concrete = subclasses(ev.Event) - {"StackChanges"}  # the base of two of them
    assert {cls.__name__ for cls in ev.EVENT_TYPES} == concrete
    assert concrete | {"StackChanges"} <= set(ev.__all__)


@pytest.mark.parametrize("cls", ev.EVENT_TYPES, ids=lambda c: c.__name__)
def test_every_event_is_a_frozen_slotted_timestamped_value(cls: type[ev.Event]) -> None:
    before = time.time()
    event = sample(cls)
    assert before <= event.timestamp <= time.time()
    assert not hasattr(event, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.timestamp = 0.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(event)) == event
    later = dataclasses.replace(event, timestamp=event.timestamp + 5)
    assert later == event, "the timestamp is not part of an event's identity"


def test_events_match_by_field() -> None:
    seen = []
    for event in (ev.Metric(S, 2, "cpu", 37.5, "%"), ev.TaskCompleted(S, 1, "f", 0, False, 1.0,
                                                                      "boom")):
        match event:
            case ev.Metric(node=node, name="cpu", value=value):
                seen.append(("cpu", node, value))
            case ev.TaskCompleted(success=False, error=error):
                seen.append(("failed", error))
    assert seen == [("cpu", 2, 37.5), ("failed", "boom")]


def test_stack_events_count_resources() -> None:
    assert ev.StackUpdated(S, {"create": 3, "same": 1}).resources == 4
    assert ev.StackPreviewed(S, {"create": 2, "delete": 5}).resources == 2
    assert ev.StackDestroyed(S, deleted=4).deleted == 4


# ---- the bus -----------------------------------------------------------------------------

def test_subscribe_all_or_by_type_and_unsubscribe() -> None:
    bus = EventBus()
    everything: list[ev.Event] = []
    metrics: list[ev.Event] = []
    bus.subscribe(everything.append)
    unsubscribe = bus.subscribe(metrics.append, ev.Metric, ev.Log)
    bus.emit(ev.Metric(S, 0, "cpu", 1.0))
    bus.emit(ev.Log(S, "hello", node=0))
    bus.emit(ev.ClusterReady(S, 1, 2.0))
    assert [type(e) for e in everything] == [ev.Metric, ev.Log, ev.ClusterReady]
    assert [type(e) for e in metrics] == [ev.Metric, ev.Log]
    unsubscribe()
    unsubscribe()  # idempotent
    bus.emit(ev.Metric(S, 0, "cpu", 2.0))
    assert len(metrics) == 2 and len(everything) == 4 and len(bus) == 1


def test_subscribing_to_the_base_class_gets_everything() -> None:
    bus = EventBus()
    got: list[ev.Event] = []
    bus.subscribe(got.append, ev.Event)
    bus.emit(ev.Error(S, "x"))
    assert len(got) == 1


def test_subscribe_rejects_non_event_types() -> None:
    bus = EventBus()
    with pytest.raises(TypeError, match="event classes"):
        bus.subscribe(print, str)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        bus.subscribe("print")  # type: ignore[arg-type]


def test_a_failing_subscriber_is_logged_and_does_not_break_others(
        caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus()
    got: list[ev.Event] = []

    def broken(event: ev.Event) -> None:
        raise RuntimeError("subscriber bug")

    bus.subscribe(broken)
    bus.subscribe(got.append)
    with caplog.at_level(logging.DEBUG, logger="skyward.events"):
        bus.emit(ev.Metric(S, 0, "cpu", 1.0))
        bus.emit(ev.Metric(S, 0, "cpu", 2.0))
    assert len(got) == 2
    records = [r for r in caplog.records if r.name == "skyward.events"]
    assert [r.levelno for r in records] == [logging.WARNING, logging.DEBUG]
    assert "broken" in records[0].getMessage() and records[0].exc_info is not None


def test_callbacks_may_subscribe_unsubscribe_and_emit_reentrantly() -> None:
    bus = EventBus()
    got: list[ev.Event] = []

    def once(event: ev.Event) -> None:
        subscription.cancel()
        bus.subscribe(got.append)
        if isinstance(event, ev.ClusterReady):
            bus.emit(ev.Log(S, "ready seen"))

    subscription = bus.subscribe(once)
    bus.emit(ev.ClusterReady(S, 1, 1.0))
    assert [type(e) for e in got] == [ev.Log]


def test_emit_and_subscribe_from_many_threads() -> None:
    bus = EventBus()
    counts: list[int] = []
    lock = threading.Lock()
    total = [0]

    def count(event: ev.Event) -> None:
        with lock:
            total[0] += 1

    bus.subscribe(count)

    def emitter() -> None:
        for i in range(500):
            bus.emit(ev.Metric(S, 0, "cpu", float(i)))

    def churner() -> None:
        for _ in range(200):
            bus.subscribe(lambda e: None)()
        counts.append(len(bus))

    threads = [threading.Thread(target=emitter) for _ in range(4)]
    threads += [threading.Thread(target=churner) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert total[0] == 2000 and len(bus) == 1


def test_summary_subscribers_get_failures_and_progress_but_not_per_task_detail() -> None:
    bus = EventBus()
    summary: list[ev.Event] = []
    bus.subscribe(summary.append, summary=True)
    assert len(bus) == 1 and not bus.task_detail
    per_task = [ev.TaskQueued(S, 1, "f"), ev.TaskStarted(S, 1, "f", 0),
                ev.TaskCompleted(S, 1, "f", 0, True, 0.1)]
    failed = ev.TaskCompleted(S, 2, "f", 0, False, 0.1, error="ValueError: x")
    progress = ev.TaskProgress(S, 0, 0, 1, 1)
    for event in (*per_task, failed, progress, ev.ClusterReady(S, 1, 1.0)):
        bus.emit(event)
    assert summary == [failed, progress, ev.ClusterReady(S, 1, 1.0)]
    assert "(summary)" in repr(bus._subscriptions[0])


@pytest.mark.parametrize(("types", "detail"), [
    ((), True), ((ev.Event,), True), ((ev.TaskStarted,), True), ((ev.TaskCompleted,), True),
    ((ev.Metric, ev.TaskQueued), True), ((ev.Metric,), False), ((ev.TaskProgress,), False),
])
def test_task_detail_follows_who_asked_for_per_task_events(
        types: tuple[type[ev.Event], ...], detail: bool) -> None:
    bus = EventBus()
    console = bus.subscribe(print, summary=True)
    subscription = bus.subscribe(print, *types)
    assert bus.task_detail is detail
    subscription.cancel()
    assert not bus.task_detail
    console.cancel()
    again = bus.subscribe(print, *types)
    assert bus.task_detail is detail
    again()
    assert not bus.task_detail and len(bus) == 0


# ---- TaskTally: a pool's task counts as TaskProgress -----------------------------------------

def test_tally_reports_at_most_every_interval_and_always_the_final_counts() -> None:
    from skyward_iac.observability.task_progress import TaskTally

    got: list[ev.TaskProgress] = []
    seen = threading.Event()

    def record(event: ev.TaskProgress) -> None:
        got.append(event)
        seen.set()

    load = [5, 1]
    tally = TaskTally(PoolIdentity(S), lambda: (load[0], load[1]), record, interval=0.3)
    started = time.monotonic()
    tally.changed()
    assert seen.wait(5)  # the first report comes at once, on a timer thread
    for _ in range(5):
        tally.completed(True)
    load[:] = [0, 0]
    tally.completed(False)
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.4)  # no change since: no more reports
    assert got == [ev.TaskProgress(S, 5, 1, 0, 0), ev.TaskProgress(S, 0, 0, 5, 1)]
    assert got[1].timestamp - got[0].timestamp >= 0.29
    assert time.monotonic() - started < 3
    assert all(t.name != f"{S}-progress" for t in threading.enumerate())


def test_tally_flush_reports_a_pending_change_at_once() -> None:
    from skyward_iac.observability.task_progress import TaskTally

    got: list[ev.TaskProgress] = []
    tally = TaskTally(PoolIdentity(S), lambda: (0, 0), got.append, interval=60)
    tally.flush()
    assert got == []  # nothing pending
    tally.changed()
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    tally.completed(True)  # the next report would wait a minute
    tally.flush()
    assert got == [ev.TaskProgress(S, 0, 0, 0, 0), ev.TaskProgress(S, 0, 0, 1, 0)]
    tally.flush()
    assert len(got) == 2


# ---- engine events -> progress -----------------------------------------------------------

def engine_event(**payload: Any) -> Any:
    from pulumi.automation import EngineEvent

    return EngineEvent.from_json({"sequence": 1, "timestamp": 0, **payload})


def step(op: str, name: str, kind: str = "skyward:index:LocalNode", **extra: Any) -> dict:
    return {"metadata": {"op": op, "urn": f"urn:pulumi:s::skyward::{kind}::{name}", "type": kind,
                         "provider": "", **extra}}


def translate(operation: str, *raw: Any) -> list[ev.Event]:
    got: list[ev.Event] = []
    translator = EngineEventTranslator(S, operation, got.append)  # type: ignore[arg-type]
    for event in raw:
        translator(event)
    return got


def test_resource_steps_become_progress_and_node_events() -> None:
    node = {"id": "i-123", "type": "aws:ec2/instance:Instance", "urn": "u", "custom": True,
            "inputs": {"instanceType": "g5.xlarge"}, "outputs": {"publicIp": "203.0.113.7"}}
    got = translate(
        "up",
        engine_event(resourcePreEvent=step("create", "s-skyward", "pulumi:pulumi:Stack")),
        engine_event(resourcePreEvent=step("create", "default", "pulumi:providers:aws")),
        engine_event(resourcePreEvent=step("create", "node-0", "aws:ec2/instance:Instance",
                                           new=node)),
        engine_event(resourcePreEvent=step("create", "node-0-host-key")),
        engine_event(resOutputsEvent=step("create", "node-0-host-key")),
        engine_event(resOutputsEvent=step("create", "node-0", "aws:ec2/instance:Instance",
                                          new=node)),
        engine_event(summaryEvent={"resourceChanges": {"create": 4}, "durationSeconds": 3}),
    )
    progress = [e for e in got if isinstance(e, ev.StackProgress)]
    assert [(p.name, p.status, p.done, p.started) for p in progress] == [
        ("node-0", "started", 0, 1), ("node-0-host-key", "started", 0, 2),
        ("node-0-host-key", "completed", 1, 2), ("node-0", "completed", 2, 2)]
    launched, provisioned = (
        e for e in got if isinstance(e, ev.InstanceLaunched | ev.InstanceProvisioned))
    assert launched == ev.InstanceLaunched(S, 0, instance_type="g5.xlarge")
    assert provisioned == ev.InstanceProvisioned(S, 0, instance_id="i-123", address="203.0.113.7")
    assert got[-1] == ev.StackUpdated(S, {"create": 2}, duration=got[-1].duration)  # type: ignore[union-attr]


def test_destroy_replace_failure_and_diagnostics() -> None:
    got = translate(
        "destroy",
        engine_event(diagnosticEvent={"message": "\x1b[31mquota exceeded\x1b[0m\n",
                                      "severity": "error", "color": "never",
                                      "urn": "urn:pulumi:s::skyward::t::node-1"}),
        engine_event(diagnosticEvent={"message": "line one\nline two\n", "severity": "info",
                                      "color": "never"}),
        engine_event(diagnosticEvent={"message": "chatter", "severity": "debug",
                                      "color": "never"}),
        engine_event(resourcePreEvent=step("delete", "node-1")),
        engine_event(resOutputsEvent=step("delete", "node-1")),
        engine_event(resourcePreEvent=step("delete", "node-2")),
        engine_event(resOpFailedEvent={**step("delete", "node-2"), "status": 1, "steps": 1}),
        engine_event(summaryEvent={"resourceChanges": {"delete": 2}}),
    )
    assert got[0] == ev.Error(S, "pulumi destroy: node-1: quota exceeded")
    assert [e.line for e in got if isinstance(e, ev.Log)] == ["line one", "line two"]
    assert ev.InstanceDestroyed(S, 1) in got and ev.InstanceDestroyed(S, 2) not in got
    failed = [e for e in got if isinstance(e, ev.StackProgress) and e.status == "failed"]
    assert [f.name for f in failed] == ["node-2"]
    assert got[-1] == ev.StackDestroyed(S, deleted=1, changes={"delete": 1},
                                        duration=got[-1].duration)  # type: ignore[union-attr]

    old, new = {"id": "i-old", "type": "t", "urn": "u"}, {"id": "i-new", "type": "t", "urn": "u"}
    replaced = translate("up", engine_event(resOutputsEvent=step("replace", "node-3", old=old,
                                                                 new=new)))
    assert ev.InstanceReplaced(S, 3, old_instance_id="i-old", instance_id="i-new") in replaced


def test_a_preview_reports_no_instance_events() -> None:
    got = translate(
        "preview",
        engine_event(resourcePreEvent=step("create", "node-0")),
        engine_event(resOutputsEvent=step("create", "node-0")),
        engine_event(summaryEvent={"resourceChanges": {"create": 2}}),
    )
    assert not [e for e in got if isinstance(e, ev.InstanceLaunched | ev.InstanceProvisioned)]
    assert isinstance(got[-1], ev.StackPreviewed) and got[-1].changes == {"create": 1}


@pytest.mark.integration
def test_translator_on_a_real_engine(tmp_path: Any) -> None:
    """A real ``pulumi up``/``destroy`` of component resources named like nodes."""
    import pulumi
    import pulumi.automation as auto

    from skyward_iac.infra.engine import locate as engine

    try:
        found = engine.find_engine()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no Pulumi engine: {exc}")

    def program() -> None:
        for i in range(2):
            node = pulumi.ComponentResource("skyward:test:Node", f"node-{i}")
            node.register_outputs({"address": f"127.0.0.{i + 2}"})
        pulumi.log.info("program ran")

    (tmp_path / "state").mkdir()
    opts = auto.LocalWorkspaceOptions(
        work_dir=str(tmp_path), pulumi_command=auto.PulumiCommand(root=str(found.root)),
        env_vars={**engine.engine_env(found), "PULUMI_BACKEND_URL": f"file://{tmp_path}/state"},
        project_settings=auto.ProjectSettings(
            name="obs", runtime="python",
            backend=auto.ProjectBackend(url=f"file://{tmp_path}/state")))
    stack = auto.create_stack("events", project_name="obs", program=program, opts=opts)
    got: list[ev.Event] = []
    stack.up(on_event=EngineEventTranslator("events", "up", got.append), color="never")
    stack.destroy(on_event=EngineEventTranslator("events", "destroy", got.append), color="never")
    kinds = [type(e) for e in got]
    assert kinds.count(ev.InstanceLaunched) == 2 and kinds.count(ev.InstanceProvisioned) == 2
    assert kinds.count(ev.InstanceDestroyed) == 2
    assert ev.Log("events", "program ran", stream="pulumi") in got
    updated = next(e for e in got if isinstance(e, ev.StackUpdated))
    destroyed = next(e for e in got if isinstance(e, ev.StackDestroyed))
    assert updated.changes == {"create": 2} and destroyed.deleted == 2
    assert {e.address for e in got if isinstance(e, ev.InstanceProvisioned)} == {
        "127.0.0.2", "127.0.0.3"}


def test_a_reported_failure_is_echoed_only_when_no_console_shows_it(tmp_path: Path) -> None:
    """Issue 29 item 9: a failure was printed by the console (its event) and again by the log
    echo on stderr. ``bus.report`` logs it once where people look; the file always has it."""
    import io
    import logging

    from skyward_iac.api.log_config import LogConfig
    from skyward_iac.observability.logging import configure_logging

    stream = io.StringIO()
    configured = configure_logging(LogConfig(file=str(tmp_path / "sky.log")), stream=stream)
    try:
        logger = logging.getLogger("skyward.test")
        bus = EventBus()
        bus.report(ev.Error(S, "first failure"), logger, logging.ERROR, "first %s", "failure")
        shown: list[ev.Event] = []
        bus.subscribe(shown.append, summary=True)  # what a console is
        bus.report(ev.Error(S, "second failure"), logger, logging.ERROR, "second failure")
        assert [e.message for e in shown] == ["second failure"]  # type: ignore[attr-defined]
        echoed = stream.getvalue()
        assert "first failure" in echoed and "second failure" not in echoed
        assert configured.file is not None
        written = configured.file.read_text()
        assert "ERROR   skyward.test [" in written and "second failure" in written
    finally:
        configure_logging(False)
