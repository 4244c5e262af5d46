"""Figure 7's tables: each figure beside linear growth from the smallest size measured.

A cell reads ``value (r×)``, r being the value divided by what linear growth from the smallest
size predicts: ``value(smallest) × nodes / smallest`` for what a pool does once per node
(connect, broadcast, threads, memory, descriptors, idle CPU, close), ``value(smallest)`` for
what does not depend on the node count (the map's fixed 100,000 tasks). r > 1 grows faster
than linear.
"""

from __future__ import annotations

from typing import Any

from scale import cell

#: (raw figure, column title, "linear" or "flat" reference)
COLUMNS = (
    ("connect s", "connect s", "linear"),
    ("broadcast ms", "broadcast ms", "linear"),
    ("map s", "map 100k s", "flat"),
    ("client CPU s", "client CPU s", "linear"),
    ("threads at ready", "client threads", "linear"),
    ("threads steady", "threads after the map", "linear"),
    ("rss at ready", "client RSS MiB", "linear"),
    ("fds at ready", "client fds", "linear"),
    ("idle CPU %", "idle client CPU %", "linear"),
    ("close s", "close s", "linear"),
)
#: The second table: what each node costs the client, and what the simulator spent.
DETAILS = (
    ("threads per node", "threads/node"), ("rss per node", "MiB/node"),
    ("fds per node", "fds/node"), ("connect client CPU s", "connect CPU s"),
    ("broadcast client CPU ms", "CPU ms/broadcast"), ("map client CPU s", "map CPU s"),
    ("map tasks/s", "map tasks/s"), ("peak rss", "peak RSS MiB"),
    ("sim CPU s", "simulator CPU s"), ("load average", "load avg"),
)


def derived(raw: dict[str, Any]) -> dict[str, float]:
    """The table's figures from one size's raw measurement (``fleet.one``)."""
    figures = {key: value for key, value in raw.items() if isinstance(value, (int, float))}
    phases = ("connect", "broadcasts", "map")
    figures["client CPU s"] = sum(raw[f"{phase} client CPU s"] for phase in phases)
    figures["sim CPU s"] = sum(raw[f"{phase} sim CPU s"] for phase in (*phases, "idle"))
    figures["idle CPU %"] = 100 * raw["idle client CPU s"] / raw["idle s"]
    figures["broadcast client CPU ms"] = 1000 * raw["broadcasts client CPU s"] / raw["broadcasts"]
    return figures


def growth(value: float, base: float, nodes: int, smallest: int, reference: str) -> float | None:
    """``value`` divided by what ``reference`` growth from ``base`` at ``smallest`` predicts."""
    expected = base * nodes / smallest if reference == "linear" else base
    return value / expected if expected else None


def table(rows: dict[int, dict[str, Any]]) -> str:
    """The figure 7 table: one row per size, each cell beside linear growth."""
    figures = {nodes: derived(raw) for nodes, raw in sorted(rows.items())}
    smallest = min(figures)
    lines = ["| nodes | " + " | ".join(title for _, title, _ in COLUMNS) + " |",
             "| ---: |" + " ---: |" * len(COLUMNS)]
    for nodes, values in figures.items():
        cells = []
        for key, _, reference in COLUMNS:
            ratio = growth(values[key], figures[smallest][key], nodes, smallest, reference)
            shown = cell(values[key])
            cells.append(shown if nodes == smallest or ratio is None else f"{shown} ({ratio:.2f}×)")
        lines.append(f"| {nodes} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def details(rows: dict[int, dict[str, Any]]) -> str:
    """Per-node costs, CPU by phase, the simulator's CPU and the machine's load."""
    figures = {nodes: derived(raw) for nodes, raw in sorted(rows.items())}
    lines = ["| nodes | " + " | ".join(title for _, title in DETAILS) + " |",
             "| ---: |" + " ---: |" * len(DETAILS)]
    for nodes, values in figures.items():
        lines.append(f"| {nodes} | " + " | ".join(cell(values[key]) for key, _ in DETAILS)
                     + " |")
    return "\n".join(lines)


def holdings(rows: dict[int, dict[str, Any]]) -> str:
    """What the client holds at the largest size: threads by name, descriptors by type."""
    nodes = max(rows)
    lines = []
    for key, when in (("census", "once every node is in service"),
                      ("census steady", "after the map")):
        held = rows[nodes].get(key)
        if held is None:
            continue  # measured before figure 7 took it
        threads = ", ".join(f"{name} {count}" for name, count in held["threads"].items())
        fds = ", ".join(f"{kind} {count}" for kind, count in held["fds"].items())
        lines.append(f"At {nodes} nodes, {when}, the client holds threads: {threads}; "
                     f"descriptors: {fds}.")
    return "\n\n".join(lines)


def half_and_all(timeline: list[list[float]], nodes: int) -> tuple[float | None, float]:
    """When half the nodes were in service (None: never seen), and when the last sample was."""
    half = next((at for at, ready in timeline if ready >= nodes / 2), None)
    return half, timeline[-1][0]


def connecting(rows: dict[int, dict[str, Any]]) -> str:
    """How the nodes came into service: the first half against the second, and the sizes
    whose nodes were not all in service in time."""
    lines = []
    for nodes, raw in sorted(rows.items()):
        if "connect timeline" not in raw:
            continue  # measured before figure 7 sampled it
        half, last = half_and_all(raw["connect timeline"], nodes)
        failed = raw.get("connect failed")
        first = "never" if half is None else f"in {half:.0f} s"
        if failed:
            lines.append(f"- {nodes} nodes: half of them in service {first}; "
                         f"{failed['ready']} of {nodes} after {failed['after s']:.0f} s, "
                         f"given up ({failed['why']})")
        elif half is not None:
            lines.append(f"- {nodes} nodes: the first half in service in {half:.1f} s, the "
                         f"second half in {last - half:.1f} s more")
    return "\n".join(lines)


def report(rows: dict[int, dict[str, Any]]) -> str:
    """Figure 7 as printed by bench/run.py and bench/fleet.py."""
    done = {nodes: raw for nodes, raw in rows.items() if "connect failed" not in raw}
    parts = [connecting(rows)]
    if done:
        smallest = min(done)
        legend = (f"(r×): measured ÷ linear growth from {smallest} nodes (the map: ÷ its time "
                  f"at {smallest} nodes); > 1 grows faster than linear.")
        parts[:0] = [table(done), legend, details(done), holdings(done)]
    return "\n\n".join(parts) + "\n"
