"""The documentation site builds with ``mkdocs build --strict`` (no warning, no network), the
API reference is generated from the docstrings, and the pictures are current."""

from __future__ import annotations

import inspect
import os
import subprocess
from pathlib import Path
from xml.etree import ElementTree

import pytest

from skyward_iac.api import errors
from tests.docs import PYTHON, ROOT


def build(out: Path, *, prefix: tuple[str, ...] = ()) -> None:
    """``mkdocs build --strict`` into ``out``; fails the test with the build's warnings."""
    done = subprocess.run(
        [*prefix, PYTHON, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT,
        capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build(out)
    return out


def test_the_build_needs_no_network(tmp_path: Path) -> None:
    isolated = ("unshare", "--net")  # a fresh network namespace: not even DNS
    if subprocess.run([*isolated, "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --net is not permitted here (needs root or user namespaces)")
    build(tmp_path, prefix=isolated)
    assert (tmp_path / "reference" / "compute" / "index.html").is_file()


@pytest.mark.parametrize("page", [
    "index.html", "getting-started/index.html", "concepts/index.html",
    "guides/dispatch/index.html", "guides/broadcast/index.html", "providers/index.html",
    "operations/index.html", "troubleshooting/index.html", "changelog/index.html",
    "examples/index.html", "contributing/index.html", "benchmarks/index.html",
    "images/benchmarks.svg", "images/console.svg", "images/fleet.svg",
])
def test_page_is_built(site: Path, page: str) -> None:
    assert (site / page).is_file()


@pytest.mark.parametrize(("page", "anchor"), [
    ("reference/compute/index.html", "skyward_iac.orchestration.compute.Compute"),
    ("reference/compute/index.html", "skyward_iac.orchestration.pool.Pool.map"),
    ("reference/function/index.html", "skyward_iac.api.function.gather"),
    ("reference/spec/index.html", "skyward_iac.api.spec.Spec"),
    ("reference/runtime/index.html", "skyward_iac.api.runtime.shard"),
    ("reference/collections/index.html", "skyward_iac.collections.context.barrier"),
    ("reference/storage/index.html", "skyward_iac.api.volumes.Volume"),
    ("reference/events/index.html", "skyward_iac.observability.events.ClusterReady"),
])
def test_reference_is_generated_from_docstrings(site: Path, page: str, anchor: str) -> None:
    assert f'id="{anchor}"' in (site / page).read_text()


def test_diagrams_are_mermaid_blocks(site: Path) -> None:
    concepts = (site / "concepts" / "index.html").read_text()
    assert concepts.count('class="mermaid"') == 2  # architecture and lifecycle state diagram


def test_the_site_loads_nothing_from_google_fonts(site: Path) -> None:
    assert "fonts.googleapis.com" not in (site / "index.html").read_text()


def test_every_error_type_is_in_the_error_reference() -> None:
    page = (ROOT / "docs" / "reference" / "errors.md").read_text()
    types = [name for name, value in inspect.getmembers(errors, inspect.isclass)
             if issubclass(value, errors.SkywardError)]
    assert len(types) >= 15
    assert [name for name in types if f"## `{name}`" not in page] == []


def test_benchmark_chart_matches_the_benchmarks_table() -> None:
    done = subprocess.run([PYTHON, str(ROOT / "tools" / "benchmark_chart.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    svg = ElementTree.parse(ROOT / "docs" / "images" / "benchmarks.svg").getroot()
    bars = svg.findall("{http://www.w3.org/2000/svg}rect")[1:]  # the first is the background
    assert len(bars) == 4 * 4  # four figures, each measured for skyward, Ray, Dask, ProcessPool


def test_scale_chart_matches_the_scale_table() -> None:
    done = subprocess.run([PYTHON, str(ROOT / "tools" / "scale_chart.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    svg = ElementTree.parse(ROOT / "docs" / "images" / "scale.svg").getroot()
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 4 * 2  # four figures, each measured and its linear reference
    points = svg.findall("{http://www.w3.org/2000/svg}circle")
    assert len(points) == 4 * 4  # at 1, 8, 16 and 32 nodes
    assert "(images/scale.svg)" in (ROOT / "docs" / "benchmarks.md").read_text()


def test_fleet_chart_matches_the_figure_7_table() -> None:
    done = subprocess.run([PYTHON, str(ROOT / "tools" / "scale_chart.py"), "--check"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr  # checks fleet.svg beside scale.svg
    svg = ElementTree.parse(ROOT / "docs" / "images" / "fleet.svg").getroot()
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 6 * 2  # six figures, each measured and its linear reference
    points = svg.findall("{http://www.w3.org/2000/svg}circle")
    sizes = {t.text for t in svg.findall("{http://www.w3.org/2000/svg}text")
             if t.get("class") == "tick"}
    assert len(sizes) >= 3 and "1000" in sizes  # up to 1,000 simulated nodes
    assert len(points) == 6 * len(sizes)  # every size in every panel
    assert "(images/fleet.svg)" in (ROOT / "docs" / "benchmarks.md").read_text()


def test_every_example_is_on_the_examples_page() -> None:
    page = (ROOT / "docs" / "examples.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "examples").glob("*.py"))
    assert [name for name in scripts if f"`examples/{name}`" not in page] == []


def test_every_public_name_has_a_reference_page() -> None:
    import skyward_iac as sky
    from skyward_iac.observability.events import Event

    index = (ROOT / "docs" / "reference" / "index.md").read_text()

    def covered(name: str) -> bool:
        value = getattr(sky, name)
        if isinstance(value, type) and issubclass(value, (errors.SkywardError, Event)):
            return True  # the error and events pages document their whole modules
        return f"`{name}`" in index

    assert [name for name in sky.__all__ if name != "__version__" and not covered(name)] == []
