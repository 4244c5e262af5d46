"""Draw docs/images/scale.svg and docs/images/fleet.svg from docs/benchmarks.md's tables.

Run it after updating those tables: ``.venv/bin/python tools/scale_chart.py``. Each chart
draws one table (the first after its section's heading): one panel per figure, the node count
across, and a dashed line for linear growth from a reference size (for a figure that should
not grow with the pool, such as a rate, that size's value kept), so what grows faster than
linear sits above it. ``--check`` exits 1 when an SVG on disk is not what its table gives now.

- scale.svg: the Scale section (figure 6, real Local pools of 1 to 32 nodes), from 8 nodes.
- fleet.svg: figure 7 (the real client against simulated nodes), from the
  smallest size.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from benchmark_chart import (
    markdown_table,
    parse_number,
    readable,
    svg_document,
    write_or_check,
)

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "benchmarks.md"
WIDTH, PANEL_HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 460, 170, 60, 20, 30, 28


@dataclass(frozen=True)
class Chart:
    """One chart: the section whose table it draws, its panels (column of the table, panel
    title, True when the figure should stay flat), the size its reference line is drawn
    through (None: the smallest), where it goes and what it shows."""

    section: str
    panels: tuple[tuple[str, str, bool], ...]
    reference_nodes: int | None
    path: Path
    label: str
    flat_means: str


SCALE = Chart(
    section="## Scale",
    panels=(("with → first result s", "with → first result (s)", False),
            ("broadcast ms", "broadcast, fn() @ pool (ms)", False),
            ("map 10k tasks/s", "map of 10,000 tasks (tasks/s)", True),
            ("exit → destroyed s", "exit → destroyed (s)", False)),
    reference_nodes=8, path=ROOT / "docs" / "images" / "scale.svg",
    label="skyward_iac Local pools from 1 to 32 nodes", flat_means="rates")
FLEET = Chart(
    section="## Figure 7: a thousand nodes, simulated",
    panels=(("connect s", "connect: every node in service (s)", False),
            ("broadcast ms", "broadcast, fn() @ pool (ms)", False),
            ("map 100k s", "map of 100,000 trivial tasks (s)", True),
            ("client CPU s", "client CPU: connect, broadcasts, map (s)", False),
            ("client threads", "client threads", False),
            ("client RSS MiB", "client RSS once ready (MiB)", False)),
    reference_nodes=None, path=ROOT / "docs" / "images" / "fleet.svg",
    label="the skyward_iac client against 10 to 1,000 simulated nodes",
    flat_means="the map")
CHARTS = (SCALE, FLEET)


@dataclass(frozen=True)
class Series:
    """One figure: its title, whether it is a rate, and its value per node count."""

    title: str
    flat: bool
    points: dict[int, float]
    #: The size the reference line goes through.
    base_nodes: int

    def reference(self, nodes: int) -> float:
        """Linear growth from ``base_nodes`` (a flat figure: its value there)."""
        base = self.points[self.base_nodes]
        return base if self.flat else base * nodes / self.base_nodes


def read_series(markdown: str, chart: Chart = SCALE) -> list[Series]:
    """The chart's columns of the first table after its section's heading."""
    lines = markdown.splitlines()
    start = lines.index(chart.section)
    header, rows = markdown_table(lines, next(
        i for i in range(start, len(lines)) if lines[i].startswith("| nodes |")))
    series = []
    for column, title, flat in chart.panels:
        if column not in header:
            raise SystemExit(f"{TABLE}: the table under {chart.section!r} has no column "
                             f"{column!r}")
        at = header.index(column)
        points = {int(row[0]): parse_number(row[at]) or 0.0 for row in rows}
        series.append(Series(title, flat, points, chart.reference_nodes or min(points)))
    return series


def draw(series: Series, top: int) -> list[str]:
    """SVG elements of one panel whose title starts at ``top``."""
    sizes = sorted(series.points)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, PANEL_HEIGHT - TOP - BOTTOM
    high = max(max(series.points.values()), *(series.reference(n) for n in sizes)) * 1.1

    def x(nodes: int) -> float:
        return LEFT + plot_w * nodes / sizes[-1]

    def y(value: float) -> float:
        return top + TOP + plot_h * (1 - value / high)

    base = top + TOP + plot_h
    parts = [f'<text x="8" y="{top + 18}" class="title">{escape(series.title)}</text>',
             f'<line x1="{LEFT}" y1="{base}" x2="{WIDTH - RIGHT}" y2="{base}" class="axis"/>',
             f'<line x1="{LEFT}" y1="{top + TOP}" x2="{LEFT}" y2="{base}" class="axis"/>']
    reference = " ".join(f"{x(n):.1f},{y(series.reference(n)):.1f}" for n in sizes)
    measured = " ".join(f"{x(n):.1f},{y(series.points[n]):.1f}" for n in sizes)
    parts += [f'<polyline points="{reference}" class="reference"/>',
              f'<polyline points="{measured}" class="measured"/>']
    for n in sizes:
        parts += [f'<circle cx="{x(n):.1f}" cy="{y(series.points[n]):.1f}" r="3" fill="#3f51b5"/>',
                  (f'<text x="{x(n):.1f}" y="{y(series.points[n]) - 6:.1f}" class="value">'
                   f'{readable(series.points[n])}</text>'),
                  f'<text x="{x(n):.1f}" y="{base + 14}" class="tick">{n}</text>']
    return parts


def render(all_series: list[Series], chart: Chart = SCALE) -> str:
    """The whole SVG document: the panels stacked vertically, and a legend."""
    height = PANEL_HEIGHT * len(all_series) + 24
    body = []
    for index, series in enumerate(all_series):
        body += draw(series, index * PANEL_HEIGHT)
    legend_y = PANEL_HEIGHT * len(all_series) + 14
    body.append(f'<text x="8" y="{legend_y}" class="note">nodes across · solid: measured · '
                f'dashed: linear from {all_series[0].base_nodes} nodes '
                f'({chart.flat_means}: flat)</text>')
    style = (".note{fill:#777}.tick,.value{text-anchor:middle}"
             ".axis{stroke:#999}.measured{fill:none;stroke:#3f51b5;stroke-width:2}"
             ".reference{fill:none;stroke:#9e9e9e;stroke-dasharray:5 4}")
    return svg_document(WIDTH, height, chart.label, style, body)


def main(argv: list[str] | None = None) -> int:
    """Write the charts, or with ``--check`` report whether they are current."""
    markdown = TABLE.read_text()
    return max(write_or_check(argv, __doc__.splitlines()[0], chart.path,
                              lambda chart=chart: render(read_series(markdown, chart), chart))
               for chart in CHARTS)


if __name__ == "__main__":
    sys.exit(main())
