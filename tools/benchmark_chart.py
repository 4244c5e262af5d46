"""Draw docs/images/benchmarks.svg from the Results table of docs/benchmarks.md.

Run it after updating the table: ``.venv/bin/python tools/benchmark_chart.py``. One panel per
headline figure, one bar per system; the chart is plain SVG written here, so the docs need no
plotting library. ``--check`` exits 1 when the SVG on disk is not what the table gives now.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "benchmarks.md"
CHART = ROOT / "docs" / "images" / "benchmarks.svg"

# (row label prefix in the Results table, panel title, True when higher is better)
PANELS = (
    ("1. round trip p50", "Trivial round trip, p50 (ms)", False),
    ("2. 10k trivial tasks", "10,000 trivial tasks (tasks/s)", True),
    ("3. 100 MB argument", "One 100 MB argument (MB/s)", True),
    ("4. cold start 1 node(s)", "with -> first result, 1 node (s)", False),
)
SYSTEMS = ("skyward", "ray", "dask", "processpool")
COLORS = {"skyward": "#3f51b5", "ray": "#9e9e9e", "dask": "#bdbdbd", "processpool": "#757575"}

PANEL_WIDTH, BAR_HEIGHT, BAR_GAP, LABEL_WIDTH, TITLE_HEIGHT = 440, 18, 6, 90, 28


@dataclass(frozen=True)
class Panel:
    """One figure: its title, whether higher is better, and a value per system (None: absent)."""

    title: str
    higher_is_better: bool
    values: dict[str, float | None]


def parse_number(cell: str) -> float | None:
    """The leading number of a cell such as ``1.83 (3.52×)`` or ``23,747``; None for ``—``."""
    match = re.match(r"\s*([0-9][0-9,]*(?:\.[0-9]+)?)", cell)
    return float(match.group(1).replace(",", "")) if match else None


def markdown_table(lines: list[str], header_index: int) -> tuple[list[str], list[list[str]]]:
    """The header cells and the rows' cells of the markdown table at ``header_index``."""
    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip("|").split("|")]

    rows = []
    for line in lines[header_index + 2:]:
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return cells(lines[header_index]), rows


def read_panels(markdown: str) -> list[Panel]:
    """The PANELS rows of the first table whose header names the systems."""
    lines = markdown.splitlines()
    header, rows = markdown_table(lines, next(
        i for i, line in enumerate(lines) if line.startswith("| figure |") and "skyward" in line))
    panels = []
    for prefix, title, higher in PANELS:
        row = next((r for r in rows if r[0].startswith(prefix)), None)
        if row is None:
            raise SystemExit(f"{TABLE}: no Results row starts with {prefix!r}")
        values = {system: parse_number(row[header.index(system)]) for system in SYSTEMS}
        panels.append(Panel(title, higher, values))
    return panels


def readable(value: float) -> str:
    """``23,747`` for large figures, three significant digits (``0.0898``) for small ones."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def draw_panel(panel: Panel, top: int) -> list[str]:
    """SVG elements of one panel whose title starts at ``top``."""
    better = "higher is better" if panel.higher_is_better else "lower is better"
    parts = [f'<text x="8" y="{top + 18}" class="title">{escape(panel.title)}'
             f'<tspan class="note" dx="6">({better})</tspan></text>']
    present = [v for v in panel.values.values() if v is not None]
    scale = (PANEL_WIDTH - LABEL_WIDTH - 80) / max(present)
    y = top + TITLE_HEIGHT
    for system, value in panel.values.items():
        parts.append(f'<text x="{LABEL_WIDTH - 6}" y="{y + 13}" class="label">{system}</text>')
        if value is None:
            parts.append(f'<text x="{LABEL_WIDTH}" y="{y + 13}" class="value">—</text>')
        else:
            width = max(1.0, value * scale)
            parts.append(f'<rect x="{LABEL_WIDTH}" y="{y}" width="{width:.1f}" '
                         f'height="{BAR_HEIGHT}" fill="{COLORS[system]}"/>')
            parts.append(f'<text x="{LABEL_WIDTH + width + 4:.1f}" y="{y + 13}" '
                         f'class="value">{readable(value)}</text>')
        y += BAR_HEIGHT + BAR_GAP
    return parts


def render(panels: list[Panel]) -> str:
    """The whole SVG document: the panels stacked vertically."""
    panel_height = TITLE_HEIGHT + len(SYSTEMS) * (BAR_HEIGHT + BAR_GAP) + 12
    height = panel_height * len(panels)
    body = []
    for index, panel in enumerate(panels):
        body += draw_panel(panel, index * panel_height)
    return svg_document(PANEL_WIDTH, height,
                        "skyward_iac benchmarks beside Ray, Dask and a process pool",
                        ".note{font-weight:normal;fill:#777}.label{text-anchor:end}", body)


def svg_document(width: int, height: int, label: str, style: str, body: list[str]) -> str:
    """A white SVG document of ``body``'s elements, with the charts' shared text style."""
    style = ("text{font-family:sans-serif;font-size:12px;fill:#333}"
             ".title{font-weight:bold;font-size:13px}" + style)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">\n'
            f'<style>{style}</style>\n<rect width="100%" height="100%" fill="#fff"/>\n'
            + "\n".join(body) + "\n</svg>\n")


def write_or_check(argv: list[str] | None, description: str, chart: Path,
                   make_svg: Callable[[], str]) -> int:
    """A chart tool's command line: write ``chart``, or with ``--check`` exit 1 when the file
    on disk is not what ``make_svg`` gives now."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="exit 1 if the chart is stale")
    args = parser.parse_args(argv)
    svg = make_svg()
    if args.check:
        if (chart.read_text() if chart.exists() else "") != svg:
            print(f"{chart} is stale: run {sys.argv[0]}", file=sys.stderr)
            return 1
        return 0
    chart.parent.mkdir(parents=True, exist_ok=True)
    chart.write_text(svg)
    print(f"wrote {chart.relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Write the chart, or with ``--check`` report whether it is current."""
    return write_or_check(argv, __doc__.splitlines()[0], CHART,
                          lambda: render(read_panels(TABLE.read_text())))


if __name__ == "__main__":
    sys.exit(main())
