"""sky.metrics: config objects, real samples from this machine, Custom, GPU via nvidia-smi."""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import threading
import time
from pathlib import Path

import cloudpickle
import pytest

from skyward_iac.api import metrics as m
from skyward_iac.api.errors import ConfigError
from skyward_iac.node import sampler as node


def by_name(samples: list[node.MetricSample]) -> dict[str, node.MetricSample]:
    return {s.name: s for s in samples}


@pytest.fixture
def no_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH without nvidia-smi, as on a CPU node."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return script


# ---- the config objects --------------------------------------------------------------------

def test_names_units_and_default_intervals() -> None:
    assert [(s.name, s.unit, s.interval) for s in m.Default()] == [
        ("cpu", "%", 1.0), ("memory", "%", 2.0), ("memory_used", "B", 2.0),
        ("memory_total", "B", 60.0), ("gpu", "%", 2.0), ("gpu_memory", "B", 2.0),
        ("gpu_memory_total", "B", 60.0), ("gpu_temp", "C", 5.0), ("disk", "%", 10.0),
        ("network_rx", "B/s", 1.0), ("network_tx", "B/s", 1.0)]
    assert {s.interval for s in m.Default(interval=5)} == {5}
    assert m.Disk("/data").name == "disk:/data" and m.Disk().path == "/"
    custom = m.Custom("queue", "echo 1", 5, unit="jobs")
    assert (custom.name, custom.interval, custom.unit) == ("queue", 5, "jobs")


def test_specs_are_frozen_and_travel_to_nodes() -> None:
    spec = m.CPU(interval=0.5)
    with pytest.raises(AttributeError):
        spec.interval = 2  # type: ignore[misc]
    for value in (m.Default(), m.Custom("x", "echo 1"), m.Disk("/tmp")):
        assert pickle.loads(cloudpickle.dumps(value)) == value


@pytest.mark.parametrize(("build", "message"), [
    (lambda: m.CPU(interval=0), "CPU.interval must be a number of seconds > 0, got 0"),
    (lambda: m.GPU(interval="fast"), "GPU.interval must be a number of seconds > 0"),
    (lambda: m.Disk("data"), "Disk.path must be an absolute path, got 'data'"),
    (lambda: m.Custom("", "echo 1"), "Custom metric needs a name"),
    (lambda: m.Custom("q", "  "), "Custom metric 'q' needs a shell command"),
])
def test_invalid_specs(build: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()  # type: ignore[operator]


def test_resolve_what_image_metrics_accepts() -> None:
    assert m.resolve(None) is None
    assert m.resolve(m.CPU()) == (m.CPU(),)
    assert m.resolve([m.CPU(), m.Disk("/x")]) == (m.CPU(), m.Disk("/x"))
    assert m.resolve(m.Default()) == m.Default()
    with pytest.raises(ConfigError, match="metrics must be None, a sky.metrics object"):
        m.resolve("cpu")
    with pytest.raises(ConfigError, match="must hold sky.metrics objects"):
        m.resolve([m.CPU(), "gpu"])
    with pytest.raises(ConfigError, match="metrics are named twice: cpu"):
        m.resolve([m.CPU(), m.CPU(interval=3)])


# ---- real samples --------------------------------------------------------------------------

def test_real_samples_from_this_machine(no_gpu: None) -> None:
    samples = by_name(node.collect_once(m.Default() + (m.Disk("/tmp"),)))
    assert set(samples) == {"cpu", "memory", "memory_used", "memory_total", "disk",
                            "disk:/tmp", "network_rx", "network_tx"}
    assert 0 <= samples["cpu"].value <= 100 and samples["cpu"].unit == "%"
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    assert samples["memory_total"].value == int(meminfo["MemTotal"].split()[0]) * 1024
    assert 0 < samples["memory_used"].value < samples["memory_total"].value
    assert 0 < samples["memory"].value < 100
    usage = shutil.disk_usage("/")
    assert samples["disk"].value == pytest.approx(100 * usage.used / (usage.used + usage.free),
                                                  abs=1.0)
    assert samples["network_rx"].value >= 0 and samples["network_tx"].unit == "B/s"
    assert all(s.device is None and abs(s.timestamp - time.time()) < 5 for s in samples.values())


def test_cpu_reflects_real_load(no_gpu: None) -> None:
    stop = threading.Event()

    def burn() -> None:
        while not stop.is_set():
            sum(range(1000))

    burner = threading.Thread(target=burn)
    burner.start()
    try:
        busy = by_name(node.collect_once([m.CPU()], window=0.5))["cpu"].value
    finally:
        stop.set()
        burner.join()
    assert busy >= 100 / (os.cpu_count() or 1) * 0.5


def test_gpu_metrics_are_silently_absent_without_nvidia_smi(
        no_gpu: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        samples = node.collect_once([m.GPU(), m.GPUMemory(), m.GPUMemoryTotal(), m.GPUTemp(),
                                  m.Memory()])
    assert [s.name for s in samples] == ["memory"]
    assert not caplog.records


def test_gpu_metrics_from_nvidia_smi_per_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls"
    fake_nvidia_smi(tmp_path, monkeypatch, f'echo "$@" >> {calls}\n'
                    'echo "0, 87, 10240, 81920, 64"\necho "1, 12, 512, 81920, [N/A]"')
    samples = node.collect_once([m.GPU(), m.GPUMemory(), m.GPUMemoryTotal(), m.GPUTemp()])
    got = {(s.name, s.device): (s.value, s.unit) for s in samples}
    assert got == {
        ("gpu", 0): (87.0, "%"), ("gpu", 1): (12.0, "%"),
        ("gpu_memory", 0): (10240 * 2**20, "B"), ("gpu_memory", 1): (512 * 2**20, "B"),
        ("gpu_memory_total", 0): (81920 * 2**20, "B"), ("gpu_memory_total", 1): (81920 * 2**20,
                                                                                "B"),
        ("gpu_temp", 0): (64.0, "C"),  # device 1 reports [N/A]: no sample, no error
    }
    assert calls.read_text().count("--query-gpu") == 1, "one nvidia-smi call per tick"


def test_a_failing_nvidia_smi_is_silent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    fake_nvidia_smi(tmp_path, monkeypatch, 'echo "NVIDIA-SMI has failed" >&2; exit 9')
    with caplog.at_level(logging.DEBUG):
        assert node.collect_once([m.GPU()]) == []
    assert not caplog.records


# ---- Custom ----------------------------------------------------------------------------------

def test_custom_reads_the_last_line(tmp_path: Path) -> None:
    (tmp_path / "depth").write_text("17\n")
    samples = node.collect_once([
        m.Custom("answer", "echo 42"),
        m.Custom("depth", f"echo reading; cat {tmp_path / 'depth'}", unit="jobs"),
        m.Custom("ratio", "printf '0.25\\n\\n'"),
    ])
    assert [(s.name, s.value, s.unit) for s in samples] == [
        ("answer", 42.0, ""), ("depth", 17.0, "jobs"), ("ratio", 0.25, "")]


@pytest.mark.parametrize("command", ["echo not-a-number", "exit 3", "true"])
def test_a_broken_custom_command_gives_no_sample_and_warns_once(
        command: str, caplog: pytest.LogCaptureFixture) -> None:
    collector = node.Collector(nvidia_smi="")
    spec = m.Custom("broken", command)
    with caplog.at_level(logging.WARNING, logger="skyward.metrics"):
        assert collector.sample([spec]) == [] and collector.sample([spec]) == []
    assert len(caplog.records) == 1
    assert "custom metric 'broken'" in caplog.records[0].getMessage()
    assert "it must print a number" in caplog.records[0].getMessage()


def test_the_warning_quotes_the_command_output_and_error(
        caplog: pytest.LogCaptureFixture) -> None:
    spec = m.Custom("depth", "echo reading; echo 'no such queue' >&2; exit 2")
    with caplog.at_level(logging.WARNING, logger="skyward.metrics"):
        assert node.Collector(nvidia_smi="").sample([spec]) == []
    assert caplog.records[0].getMessage() == (
        "custom metric 'depth': `echo reading; echo 'no such queue' >&2; exit 2` exited 2 "
        "printing 'reading' (no such queue); it must print a number")


def test_a_slow_custom_command_times_out(caplog: pytest.LogCaptureFixture) -> None:
    spec = m.Custom("slow", "sleep 5; echo 1", timeout=0.3)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="skyward.metrics"):
        assert node.Collector(nvidia_smi="").sample([spec]) == []
    assert time.monotonic() - started < 3
    assert "timed out after 0.3s" in caplog.text


# ---- the sampler thread --------------------------------------------------------------------

def test_sampler_honours_each_interval_and_stops(no_gpu: None) -> None:
    batches: list[list[node.MetricSample]] = []
    sampler = node.MetricsSampler([m.CPU(interval=0.1), m.Memory(interval=0.5),
                                m.Custom("one", "echo 1", interval=0.25)], batches.append)
    sampler.start()
    time.sleep(1.3)
    sampler.stop()
    count = len(batches)
    time.sleep(0.3)
    assert len(batches) == count, "no samples after stop()"
    names = [s.name for batch in batches for s in batch]
    # cpu: first sample one interval in (it is a rate); memory and custom: at once.
    # Bounds leave room for a loaded CI machine; the ratios are what the intervals decide.
    assert 6 <= names.count("cpu") <= 14, names
    assert 2 <= names.count("memory") <= 4, names
    assert 3 <= names.count("one") <= 7, names
    assert names.count("cpu") >= names.count("one") >= names.count("memory")
    assert not sampler._thread.is_alive()


def test_sampler_survives_a_failing_callback(no_gpu: None,
                                             caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def flaky(batch: list[node.MetricSample]) -> None:
        calls.append(batch)
        raise RuntimeError("consumer bug")

    with caplog.at_level(logging.WARNING, logger="skyward.metrics"):
        sampler = node.MetricsSampler([m.Memory(interval=0.1)], flaky).start()
        time.sleep(0.45)
        sampler.stop()
    assert len(calls) >= 3
    assert "metrics callback failed" in caplog.text


def test_an_empty_sampler_starts_no_thread() -> None:
    sampler = node.MetricsSampler([], lambda batch: None).start()
    assert not sampler._thread.is_alive()
    sampler.stop()


def test_specs_travel_to_the_agent_as_json_and_come_back_equal() -> None:
    specs = (*m.Default(interval=2), m.Disk("/data"),
             m.Custom("queue", "redis-cli llen jobs", interval=5, unit="jobs"))
    text = m.to_json(specs)
    assert "pickle" not in text and '"type":"Custom"' in text
    assert m.from_json(text) == specs
    with pytest.raises(ConfigError, match="unknown metric type"):
        m.from_json('[{"type": "Bogus", "interval": 1}]')
    with pytest.raises(ConfigError, match="interval"):
        m.from_json('[{"type": "CPU", "interval": 0}]')
