"""``sky.metrics`` end to end: a real Local node's agent samples and streams ``Metric`` events."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator

import pytest

import skyward_iac as sky

INTERVAL = 0.5


class Metrics:
    """``Metric`` events as they arrive, with the monotonic time they arrived."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[float, sky.Metric]] = []

    def __call__(self, event: sky.Metric) -> None:
        with self.lock:
            self.events.append((time.monotonic(), event))

    def named(self, name: str) -> list[sky.Metric]:
        with self.lock:
            return [e for _, e in self.events if e.name == name]

    def wait_for(self, names: set[str], count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(len(self.named(n)) < count for n in names):
            if time.monotonic() > deadline:
                got = {n: len(self.named(n)) for n in names}
                raise AssertionError(f"expected {count} samples of each of {names}, got {got}")
            time.sleep(0.05)


@pytest.fixture(scope="module")
def metrics() -> Iterator[tuple[sky.Pool, Metrics]]:
    recorder = Metrics()
    image = sky.Image(metrics=(
        sky.metrics.CPU(interval=INTERVAL), sky.metrics.Memory(interval=INTERVAL),
        sky.metrics.MemoryTotal(interval=INTERVAL), sky.metrics.GPU(interval=INTERVAL),
        sky.metrics.Custom("answer", "echo 42", interval=INTERVAL, unit="n"),
    ))
    with sky.Compute(provider=sky.Local(), nodes=1, image=image,
                     options=sky.Options(console="silent")) as pool:
        pool.on(sky.Metric, recorder)
        yield pool, recorder


def test_cpu_and_memory_samples_arrive_within_seconds(metrics: tuple[sky.Pool, Metrics]) -> None:
    pool, recorder = metrics
    subscribed = time.monotonic()
    recorder.wait_for({"cpu", "memory", "memory_total", "answer"}, count=3, timeout=10)
    first = min(t for t, e in recorder.events if e.name == "cpu")
    assert first - subscribed < 5  # one interval, plus the way through SSH
    for event in recorder.named("cpu") + recorder.named("memory"):
        assert event.stack == pool.stack_name and event.node == 0 and event.device is None
        assert event.unit == "%" and 0.0 <= event.value <= 100.0
    assert recorder.named("memory")[-1].value > 0.0
    total = recorder.named("memory_total")[-1]
    assert total.unit == "B" and total.value > 64 * 2**20
    assert {e.value for e in recorder.named("answer")} == {42.0}
    assert recorder.named("answer")[0].unit == "n"
    # Samples keep coming at about the interval (not a one-off burst).
    cpu_times = [e.timestamp for e in recorder.named("cpu")]
    gaps = [b - a for a, b in zip(cpu_times, cpu_times[1:], strict=False)]
    assert all(INTERVAL * 0.5 < gap < INTERVAL * 4 for gap in gaps), gaps


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None,
                    reason="this machine has nvidia-smi: GPU metrics would be present")
def test_gpu_metrics_are_silently_absent_without_nvidia_smi(
        metrics: tuple[sky.Pool, Metrics]) -> None:
    _, recorder = metrics
    recorder.wait_for({"cpu"}, count=3, timeout=10)
    assert recorder.named("gpu") == []


def test_metrics_none_sends_no_samples() -> None:
    recorder = Metrics()
    with sky.Compute(provider=sky.Local(), nodes=1, image=sky.Image(metrics=None),
                     options=sky.Options(console="silent")) as pool:
        pool.on(sky.Metric, recorder)
        assert pool.run(sky.function(lambda: 7)()) == 7  # the node works; it just sends no metric
        time.sleep(2.0)
    assert recorder.events == []
