"""What every figure shares: a measurement, the systems' interface, timing and the table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

#: The peers measured beside skyward_iac, in table order; "skyward-tls" is skyward_iac itself
#: over its TLS data port (a cloud node's path) where skyward's own row uses a Local node's
#: Unix socket (bench/systems.py ``SkywardTls``).
PEERS = ("skyward-tls", "ray", "dask", "processpool", "tcp-floor")
SKYWARD = "skyward"

Better = Literal["lower", "higher"]


@dataclass(frozen=True)
class Row:
    """One figure: its unit, which direction is better, the target, and a value per system."""

    figure: str
    unit: str
    better: Better
    target: float | None = None
    values: dict[str, float | None] = field(default_factory=dict)
    note: str = ""


class System(Protocol):
    """A way to run Python functions on 2 workers: skyward_iac or one of its peers."""

    name: str

    def start(self, workers: int = 2) -> None: ...
    def stop(self) -> None: ...
    def call(self, fn: Callable[..., Any], *args: Any) -> Any: ...
    def map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]: ...


def percentile(samples: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``samples``."""
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


def timed(action: Callable[[], Any]) -> float:
    """Seconds one call of ``action`` takes."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def repeat_until(action: Callable[[], float], times: int, budget: float) -> float:
    """Median of up to ``times`` runs of ``action`` (each returning a figure), stopping early
    once ``budget`` seconds are spent: slow peers get fewer repetitions, never an endless run."""
    started, figures = time.monotonic(), []
    for _ in range(times):
        figures.append(action())
        if time.monotonic() - started > budget:
            break
    return statistics.median(figures)


def ratio(row: Row, peer: str) -> float | None:
    """How many times better skyward_iac is than ``peer`` on ``row`` (>1: skyward is better)."""
    ours, theirs = row.values.get(SKYWARD), row.values.get(peer)
    if not ours or not theirs:
        return None
    return theirs / ours if row.better == "lower" else ours / theirs


def _number(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _verdict(row: Row) -> str:
    ours = row.values.get(SKYWARD)
    if row.target is None or ours is None:
        return ""
    met = ours <= row.target if row.better == "lower" else ours >= row.target
    sign = "<=" if row.better == "lower" else ">="
    return f"{sign} {_number(row.target)}: {'met' if met else 'MISSED'}"


def table(rows: Iterable[Row], peers: Iterable[str] = PEERS) -> str:
    """A markdown table: each peer's value and, in parentheses, skyward's advantage over it."""
    peers = list(peers)
    header = ["figure", "unit", SKYWARD, *peers, "target"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([" --- "] * 2 + [" ---: "] * (len(header) - 3) + [" --- "]) + "|"]
    for row in rows:
        cells = [row.figure + (f" ({row.note})" if row.note else ""), row.unit,
                 _number(row.values.get(SKYWARD))]
        for peer in peers:
            value, times = row.values.get(peer), ratio(row, peer)
            cells.append(_number(value) + (f" ({times:.2f}×)" if times is not None else ""))
        cells.append(_verdict(row))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
