"""Run examples/notebook.ipynb in a real kernel, save it with its outputs, render it for the docs.

``.venv/bin/python tools/execute_notebook.py`` after editing the notebook: it brings up the
notebook's Local pool (so it needs what ``scripts/setup`` installs), in a throwaway skyward
home; writes the outputs into the notebook, with a digest of the cell sources they came from;
and renders it (nbconvert's Markdown exporter) into docs/examples/notebook.md and its images
into docs/examples/notebook_files/, the page the docs site shows. ``--render`` only renders.
``--check`` verifies, without a kernel, that the saved outputs come from the cells as they are
now and that the page is what rendering gives now (exit 1 otherwise); the test suite runs it,
and executes the notebook itself too.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "notebook.ipynb"
PAGE = ROOT / "docs" / "examples" / "notebook.md"
IMAGES = "notebook_files"  # beside the page
HEADER = ("<!-- Generated from examples/notebook.ipynb by tools/execute_notebook.py: "
          "edit the notebook, then run the tool. -->\n\n")
#: Where the digest of the executed sources is kept in the notebook's metadata.
KEY = "skyward_iac"


def sources_digest(notebook: nbformat.NotebookNode) -> str:
    """A digest of every cell's type and source: what the saved outputs were computed from."""
    digest = hashlib.sha256()
    for cell in notebook.cells:
        digest.update(f"{cell.cell_type}\0{cell.source}\0".encode())
    return digest.hexdigest()


def is_current(notebook: nbformat.NotebookNode) -> bool:
    """Whether the saved outputs were computed from the cells as they are now."""
    return notebook.metadata.get(KEY, {}).get("executed_sources") == sources_digest(notebook)


def render(notebook: nbformat.NotebookNode) -> dict[str, bytes]:
    """The docs page and its images, by file name relative to the page's directory."""
    from nbconvert import MarkdownExporter

    body, resources = MarkdownExporter().from_notebook_node(
        notebook, resources={"output_files_dir": IMAGES, "unique_key": "notebook"})
    return {PAGE.name: (HEADER + body.strip() + "\n").encode(), **resources["outputs"]}


def rendered_files() -> dict[str, bytes]:
    """The page and images on disk now."""
    files = {PAGE.name: PAGE.read_bytes()} if PAGE.exists() else {}
    images = PAGE.parent / IMAGES
    if images.is_dir():
        files |= {f"{IMAGES}/{p.name}": p.read_bytes() for p in sorted(images.iterdir())}
    return files


def write_page(notebook: nbformat.NotebookNode) -> None:
    images = PAGE.parent / IMAGES
    if images.is_dir():
        shutil.rmtree(images)
    images.mkdir(parents=True)
    for name, content in render(notebook).items():
        (PAGE.parent / name).write_bytes(content)


def execute(path: Path) -> None:
    from nbclient import NotebookClient
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    from skyward_iac.infra.engine import locate as engine

    notebook = nbformat.read(path, as_version=4)
    os.environ["SKYWARD_PULUMI_ROOT"] = str(engine.find_engine().root)
    with tempfile.TemporaryDirectory(prefix="skyward-notebook-") as home:
        os.environ["SKYWARD_HOME"] = home
        NotebookClient(notebook, timeout=600, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    notebook, _ = CoalesceStreamsPreprocessor().preprocess(notebook, {})  # a line is no output
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
    notebook.metadata[KEY] = {"executed_sources": sources_digest(notebook)}
    nbformat.write(notebook, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true",
                      help="exit 1 when the saved outputs or the docs page are out of date")
    what.add_argument("--render", action="store_true",
                      help="only render the saved notebook into the docs page")
    args = parser.parse_args(argv)
    if args.check:
        notebook = nbformat.read(NOTEBOOK, as_version=4)
        if not is_current(notebook):
            print(f"{NOTEBOOK}: its outputs are older than its cells; run "
                  "tools/execute_notebook.py to execute it again", file=sys.stderr)
            return 1
        if render(notebook) != rendered_files():
            print(f"{PAGE} is not the rendering of {NOTEBOOK}; run "
                  "tools/execute_notebook.py --render", file=sys.stderr)
            return 1
        return 0
    if not args.render:
        execute(NOTEBOOK)
        print(f"{NOTEBOOK}: executed and saved with its outputs")
    write_page(nbformat.read(NOTEBOOK, as_version=4))
    print(f"{PAGE}: rendered")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
