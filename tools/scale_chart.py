"""Draw docs/images/scale.svg from the Local pools table of docs/benchmarks.md's Scale section.

Run it after updating that table: ``.venv/bin/python tools/scale_chart.py``. One panel per
figure, the node count across; a dashed line shows linear growth from the 8-node point (for
throughput: the 8-node rate kept), so what grows faster than linear sits above it. ``--check``
exits 1 when the SVG on disk is not what the table gives now.
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
CHART = ROOT / "docs" / "images" / "scale.svg"
SECTION = "## Scale"
#: (column of the table, panel title, True when it is a rate that should stay flat)
PANELS = (
    ("with → first result s", "with → first result (s)", False),
    ("broadcast ms", "broadcast, fn() @ pool (ms)", False),
    ("map 10k tasks/s", "map of 10,000 tasks (tasks/s)", True),
    ("exit → destroyed s", "exit → destroyed (s)", False),
)
#: The size the dashed reference line is drawn through.
REFERENCE_NODES = 8
WIDTH, PANEL_HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 460, 170, 60, 20, 30, 28


@dataclass(frozen=True)
class Series:
    """One figure: its title, whether it is a rate, and its value per node count."""

    title: str
    rate: bool
    points: dict[int, float]

    def reference(self, nodes: int) -> float:
        """Linear growth from ``REFERENCE_NODES`` (a rate: the same rate)."""
        base = self.points[REFERENCE_NODES]
        return base if self.rate else base * nodes / REFERENCE_NODES


def read_series(markdown: str) -> list[Series]:
    """The PANELS columns of the first table after the Scale heading."""
    lines = markdown.splitlines()
    start = lines.index(SECTION)
    header, rows = markdown_table(lines, next(
        i for i in range(start, len(lines)) if lines[i].startswith("| nodes |")))
    series = []
    for column, title, rate in PANELS:
        if column not in header:
            raise SystemExit(f"{TABLE}: the Scale table has no column {column!r}")
        at = header.index(column)
        points = {int(row[0]): parse_number(row[at]) or 0.0 for row in rows}
        series.append(Series(title, rate, points))
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
                  f'<text x="{x(n):.1f}" y="{y(series.points[n]) - 6:.1f}" class="value">'
                  f'{readable(series.points[n])}</text>',
                  f'<text x="{x(n):.1f}" y="{base + 14}" class="tick">{n}</text>']
    return parts


def render(all_series: list[Series]) -> str:
    """The whole SVG document: the panels stacked vertically, and a legend."""
    height = PANEL_HEIGHT * len(all_series) + 24
    body = []
    for index, series in enumerate(all_series):
        body += draw(series, index * PANEL_HEIGHT)
    legend_y = PANEL_HEIGHT * len(all_series) + 14
    body.append(f'<text x="8" y="{legend_y}" class="note">nodes across · solid: measured · '
                f'dashed: linear from {REFERENCE_NODES} nodes (rates: flat)</text>')
    style = (".note{fill:#777}.tick,.value{text-anchor:middle}"
             ".axis{stroke:#999}.measured{fill:none;stroke:#3f51b5;stroke-width:2}"
             ".reference{fill:none;stroke:#9e9e9e;stroke-dasharray:5 4}")
    return svg_document(WIDTH, height, "skyward_iac Local pools from 1 to 32 nodes", style, body)


def main(argv: list[str] | None = None) -> int:
    """Write the chart, or with ``--check`` report whether it is current."""
    return write_or_check(argv, __doc__.splitlines()[0], CHART,
                          lambda: render(read_series(TABLE.read_text())))


if __name__ == "__main__":
    sys.exit(main())
