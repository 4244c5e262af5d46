"""The node side of ``sky.metrics``: read the sources, on each metric's schedule.

The worker agent runs ``MetricsSampler(image.metrics, send).start()`` and streams each batch
of ``MetricSample`` to the client, which turns them into ``Metric`` events. ``collect_once``
takes one sample of each (for tests and one-off checks).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from skyward_iac.api.metrics import (
    CPU,
    GPU,
    Custom,
    Disk,
    GPUMemory,
    GPUMemoryTotal,
    GPUTemp,
    Memory,
    MemoryTotal,
    MemoryUsed,
    MetricSpec,
    NetworkRx,
    NetworkTx,
)

log = logging.getLogger("skyward.metrics")


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One measured value; ``device`` is the GPU index for GPU metrics."""

    name: str
    value: float
    unit: str
    timestamp: float
    device: int | None = None


_GPU_FIELDS = "index,utilization.gpu,memory.used,memory.total,temperature.gpu"
_GPU_COLUMN = {GPU: 1, GPUMemory: 2, GPUMemoryTotal: 3, GPUTemp: 4}
_MIB = 1024 * 1024


class Collector:
    """Reads the sources; rates (CPU, network) need two reads, so it keeps the last one."""

    def __init__(self, nvidia_smi: str | None = None) -> None:
        self._nvidia_smi = nvidia_smi if nvidia_smi is not None else shutil.which("nvidia-smi")
        self._previous: dict[MetricSpec, tuple[float, float]] = {}
        self._gpu: tuple[float, list[list[str]]] = (-1.0, [])
        self._warned: set[str] = set()

    def sample(self, specs: Iterable[MetricSpec]) -> list[MetricSample]:
        """One sample per spec (per GPU for GPU specs); specs that cannot be read are skipped.

        The first sample of a rate metric only primes it and yields nothing.
        """
        out: list[MetricSample] = []
        for spec in specs:
            try:
                out.extend(self._read(spec))
            except (OSError, ValueError, IndexError, KeyError) as exc:
                self._warn_once(spec.name, f"metric {spec.name} could not be read: {exc}")
        return out

    def _read(self, spec: MetricSpec) -> list[MetricSample]:
        now = time.time()

        def one(value: float) -> list[MetricSample]:
            return [MetricSample(spec.name, value, spec.unit, now)]

        if isinstance(spec, CPU):
            fields = [float(x) for x in _read("/proc/stat").split("\n", 1)[0].split()[1:]]
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
            rate = self._rate(spec, sum(fields) - idle, sum(fields))
            return [] if rate is None else one(max(0.0, min(100.0, 100.0 * rate)))
        if isinstance(spec, Memory | MemoryUsed | MemoryTotal):
            total, available = _meminfo()
            if isinstance(spec, Memory):
                return one(100.0 * (total - available) / total if total else 0.0)
            return one(total - available if isinstance(spec, MemoryUsed) else total)
        if isinstance(spec, Disk):
            st = os.statvfs(spec.path)
            used = (st.f_blocks - st.f_bfree) * st.f_frsize
            usable = used + st.f_bavail * st.f_frsize
            return one(100.0 * used / usable if usable else 0.0)
        if isinstance(spec, NetworkRx | NetworkTx):
            received, sent = _network_bytes()
            rate = self._rate(spec, received if isinstance(spec, NetworkRx) else sent, None)
            return [] if rate is None else one(rate)
        if isinstance(spec, Custom):
            value = self._custom(spec)
            return [] if value is None else [MetricSample(spec.name, value, spec.unit, now)]
        if type(spec) in _GPU_COLUMN:
            return self._gpu_samples(spec, _GPU_COLUMN[type(spec)], now)
        raise ValueError(f"unknown metric {spec!r}")

    def _rate(self, spec: MetricSpec, counter: float, total: float | None) -> float | None:
        """Per-second change of ``counter`` (or its share of ``total``'s change) since last."""
        base = total if total is not None else time.monotonic()
        previous = self._previous.get(spec)
        self._previous[spec] = (counter, base)
        if previous is None or base <= previous[1]:
            return None
        return max(0.0, (counter - previous[0]) / (base - previous[1]))

    def _gpu_samples(self, spec: MetricSpec, column: int, now: float) -> list[MetricSample]:
        rows = self._gpu_rows()
        scale = _MIB if spec.unit == "B" else 1
        out = []
        for row in rows:
            try:
                out.append(MetricSample(spec.name, float(row[column]) * scale, spec.unit, now,
                                        device=int(row[0])))
            except (ValueError, IndexError):
                continue  # "[N/A]": this GPU does not report that field
        return out

    def _gpu_rows(self) -> list[list[str]]:
        # GPU, GPUMemory and GPUTemp due in the same tick share one nvidia-smi call.
        fetched, rows = self._gpu
        if time.monotonic() - fetched < 0.5:
            return rows
        rows = []
        if self._nvidia_smi:
            try:
                done = subprocess.run(
                    [self._nvidia_smi, f"--query-gpu={_GPU_FIELDS}",
                     "--format=csv,noheader,nounits"],
                    capture_output=True, text=True, timeout=5, check=False)
                if done.returncode == 0:
                    rows = [[c.strip() for c in line.split(",")]
                            for line in done.stdout.splitlines() if line.strip()]
            except (OSError, subprocess.TimeoutExpired):
                pass  # no usable driver: GPU metrics are simply absent
        self._gpu = (time.monotonic(), rows)
        return rows

    def _custom(self, spec: Custom) -> float | None:
        try:
            done = subprocess.run(["/bin/sh", "-c", spec.command], capture_output=True,
                                  text=True, timeout=spec.timeout, check=False)
        except subprocess.TimeoutExpired:
            self._warn_once(spec.name, f"custom metric {spec.name!r} timed out after "
                                       f"{spec.timeout:g}s")
            return None
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        try:
            if done.returncode != 0 or not lines:
                raise ValueError
            return float(lines[-1].strip())
        except ValueError:
            said = repr(lines[-1].strip()) if lines else "nothing"
            errors = done.stderr.strip().splitlines()[-1:]
            self._warn_once(spec.name, f"custom metric {spec.name!r}: `{spec.command}` exited "
                                       f"{done.returncode} printing {said}"
                                       f"{f' ({errors[0]})' if errors else ''}; "
                                       "it must print a number")
            return None

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)


def _read(path: str) -> str:
    with open(path, encoding="ascii") as handle:
        return handle.read()


def _meminfo() -> tuple[float, float]:
    values = {}
    for line in _read("/proc/meminfo").splitlines():
        key, _, rest = line.partition(":")
        values[key] = float(rest.split()[0]) * 1024  # the kernel reports kB
    return values["MemTotal"], values.get("MemAvailable", values.get("MemFree", 0.0))


def _network_bytes() -> tuple[float, float]:
    received = sent = 0.0
    for line in _read("/proc/net/dev").splitlines()[2:]:
        interface, _, counters = line.partition(":")
        if interface.strip() == "lo":
            continue
        fields = counters.split()
        received += float(fields[0])
        sent += float(fields[8])
    return received, sent


def collect_once(metrics: Iterable[MetricSpec], window: float = 0.2) -> list[MetricSample]:
    """Sample ``metrics`` once; rate metrics are measured over ``window`` seconds."""
    specs = tuple(metrics)
    collector = Collector()
    rates = [s for s in specs if isinstance(s, CPU | NetworkRx | NetworkTx)]
    if rates:
        collector.sample(rates)
        time.sleep(window)
    return collector.sample(specs)


class MetricsSampler:
    """A daemon thread sampling each metric at its interval and passing batches to ``callback``.

    ``MetricsSampler(specs, send).start()``; ``stop()`` ends it. A failing callback is logged
    and sampling goes on.
    """

    def __init__(self, metrics: Iterable[MetricSpec],
                 callback: Callable[[list[MetricSample]], object],
                 collector: Collector | None = None) -> None:
        self.metrics = tuple(metrics)
        self.callback = callback
        self.collector = collector or Collector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skyward-metrics", daemon=True)

    def start(self) -> MetricsSampler:
        """Start sampling; returns self."""
        if self.metrics:
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sampling and wait for the thread (at most ``timeout`` s)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        # Rates need a first read; taking it now makes the first CPU sample one interval in.
        self.collector.sample(s for s in self.metrics if isinstance(s, CPU | NetworkRx | NetworkTx))
        start = time.monotonic()
        due = {spec: start + (spec.interval if isinstance(spec, CPU | NetworkRx | NetworkTx)
                              else 0.0) for spec in self.metrics}
        while not self._stop.is_set():
            now = time.monotonic()
            ready = [spec for spec, at in due.items() if at <= now]
            for spec in ready:
                # A slow tick (a stuck custom command) skips missed samples, not bursts them.
                due[spec] = max(due[spec] + spec.interval, now)
            if ready and (samples := self.collector.sample(ready)):
                try:
                    self.callback(samples)
                except Exception:  # noqa: BLE001 - the sampler outlives a broken consumer
                    log.warning("metrics callback failed", exc_info=True)
            self._stop.wait(max(0.0, min(due.values()) - time.monotonic()))
