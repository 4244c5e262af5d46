"""Following the bootstrap's output: steps reported as their markers arrive, timed, failed."""

from __future__ import annotations

from skyward_iac.remote.bootstrap_progress import StepUpdate, StepWatcher


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_steps_are_reported_as_markers_arrive_in_any_chunking() -> None:
    clock, updates, lines = Clock(), [], []
    watcher = StepWatcher(2, ["apt packages", "agent"], updates.append, lines.append, clock)
    watcher.write("::step apt pack")
    assert updates == []  # half a marker is not a step yet
    watcher.write("ages\nReading package lists...\n")
    assert updates == [StepUpdate(2, "apt packages", "started", 0, 2)]
    clock.now += 1.5
    watcher.write("done\n::step agent\n")
    assert updates[1] == StepUpdate(2, "apt packages", "completed", 0, 2, 1.5)
    assert updates[2].status == "started" and updates[2].name == "agent"
    clock.now += 0.25
    watcher.write("::agent-port 40123\n")
    assert updates[3] == StepUpdate(2, "agent", "completed", 1, 2, 0.25)
    assert watcher.agent_port == 40123
    assert lines == ["Reading package lists...", "done"]
    assert watcher.durations == {"apt packages": 1.5, "agent": 0.25}


def test_a_plugin_step_not_in_the_plan_still_gets_a_place() -> None:
    updates: list[StepUpdate] = []
    watcher = StepWatcher(0, ["agent"], updates.append)
    watcher.write("::step surprise\n")
    assert (updates[0].index, updates[0].total) == (1, 2)


def test_failure_keeps_only_the_failing_steps_tail_and_its_command() -> None:
    updates: list[StepUpdate] = []
    watcher = StepWatcher(1, ["node packages", "image packages"], updates.append)
    watcher.write("::step node packages\nfrom an earlier step\n::step image packages\n")
    watcher.write("".join(f"line {i}\n" for i in range(30)))
    watcher.write("::failed 2 \"$UV\" pip install torch\nno newline at the end")
    failure = watcher.failure(2)
    assert failure.step == "image packages" and failure.command == '"$UV" pip install torch'
    assert failure.tail[-1] == "no newline at the end" and len(failure.tail) == 20
    assert "from an earlier step" not in failure.tail
    assert updates[-1].status == "failed" and "pip install torch" in updates[-1].detail


def test_a_timeout_names_the_step_that_was_running() -> None:
    watcher = StepWatcher(0, ["apt packages"])
    watcher.write("::step apt packages\nWaiting for cache lock\n")
    failure = watcher.failure(124, reason="timed out after 30s")
    assert failure.summary == "timed out after 30s (exit code 124)"
    assert StepWatcher(0, []).failure(255).step == "start"
