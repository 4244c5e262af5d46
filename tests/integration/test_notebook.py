"""Pools in a real Jupyter kernel: the example notebook run end to end with nbclient, remote
output under the cell that ran the task, the stop button in every phase, and the kernel's
shutdown: after each, no stack resource, process or sandbox is left."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.processes import is_alive
from tests.helpers import stack_processes, stack_sandboxes, stored_resource_count
from tests.integration.notebook_kernel import Kernel, ipython_dir

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "notebook.ipynb"
STACK = r"(local-[A-Za-z0-9_.-]+-\d{8}-\d{6}-[0-9a-f]{6})"
ESCAPE = "\x1b["


@pytest.fixture(scope="module")
def ipython(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ipython_dir(tmp_path_factory.mktemp("ipython"))


def wait_until_gone(stack: str, timeout: float = 60) -> None:
    """No resource in the stack, no process and no sandbox of its nodes (fails after timeout)."""
    deadline = time.monotonic() + timeout
    while stack_processes(stack) or stack_sandboxes(stack) or stored_resource_count(stack):
        if time.monotonic() > deadline:
            raise AssertionError(f"{stack} still there after {timeout}s: pids "
                                 f"{stack_processes(stack)}, sandboxes {stack_sandboxes(stack)}, "
                                 f"{stored_resource_count(stack)} resource(s)")
        time.sleep(0.25)
    assert ClusterStack.select(stack).resource_count() == 0  # the engine's view, once


def reapers_of(pid: int) -> list[int]:
    """Live reaper processes watching the kernel ``pid``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"skyward_iac.orchestration.kernel_reaper" in cmdline and str(pid).encode() in cmdline:
            found.append(int(proc.name))
    return [p for p in found if is_alive(p)]


# ---- the example notebook -------------------------------------------------------------------

def cell(notebook: Any, tag: str) -> Any:
    (found,) = [c for c in notebook.cells if tag in c.metadata.get("tags", [])]
    return found


def streams(code_cell: Any, name: str = "stdout") -> str:
    return "".join(o.text for o in code_cell.outputs
                   if o.output_type == "stream" and o.name == name)


def test_the_docs_page_is_the_rendering_of_the_notebook_as_it_is_now() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "execute_notebook.py"), "--check"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    saved = nbformat.read(NOTEBOOK, as_version=4)
    assert [o for o in cell(saved, "plot").outputs if "image/png" in o.get("data", {})]
    assert (ROOT / "docs" / "examples" / "notebook_files" / "notebook_12_0.png").is_file()


@pytest.mark.integration
def test_the_example_notebook_runs_in_a_real_kernel(ipython: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IPYTHONDIR", str(ipython))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    # The console: one display in the pool's cell, HTML and plain text, updated in place to
    # its final state (the session closed in the last cell).
    pool_cell = cell(notebook, "pool")
    (console,) = [o for o in pool_cell.outputs if o.output_type == "display_data"]
    plain, html = console.data["text/plain"], console.data["text/html"]
    stack = re.search(STACK, plain).group(1)  # type: ignore[union-attr]
    assert f"pool {stack} ready: 2 node(s)" in plain
    assert f"stack {stack} destroyed in" in plain
    assert html.startswith("<pre") and f"pool {stack} ready" in html
    assert console.metadata == {} and "transient" not in console
    (result,) = [o for o in pool_cell.outputs if o.output_type == "execute_result"]
    assert result.data["text/plain"] == f"<Pool {stack} nodes=2>"

    # A function and a class defined in cells, and a global, ran on a node and came back.
    one = streams(cell(notebook, "one"))
    assert re.search(r"^\[node [01]\] seed 0: \d+ of 100000 points inside the circle$", one,
                     re.MULTILINE)
    assert re.search(r"^node [01]: pi ~ 3\.1\d+, an Estimate: True$", one, re.MULTILINE)
    mapped = streams(cell(notebook, "map"))
    assert "8 estimates from nodes [0, 1]: pi ~ 3.1" in mapped
    assert len(re.findall(r"^\[node [01]\] seed [1-8]: ", mapped, re.MULTILINE)) == 8

    # Broadcast + collections: the counter is the sum of what each node returned.
    broadcast = streams(cell(notebook, "broadcast"))
    found = re.search(r"per node: \[(\d+), (\d+)\]; counter: (\d+); pi ~ 3\.1", broadcast)
    assert found, broadcast
    assert int(found.group(1)) + int(found.group(2)) == int(found.group(3))
    assert len(re.findall(r"^\[node 0\] seed 1\d\d: ", broadcast, re.MULTILINE)) == 6

    # The plot: a PNG, drawn from the dict the nodes filled (6 seeds each).
    plot = cell(notebook, "plot")
    assert [o for o in plot.outputs if "image/png" in o.get("data", {})]
    assert "{0: 6, 1: 6}" in streams(plot)

    # No cell shows terminal escape codes, and none failed.
    for code_cell in notebook.cells:
        for output in code_cell.get("outputs", []):
            assert output.output_type != "error", output
            assert ESCAPE not in str(output.get("text", "")) + str(output.get("data", ""))
    wait_until_gone(stack)


# ---- the stop button and the kernel's shutdown ------------------------------------------------

@pytest.fixture(scope="module")
def kernel(ipython: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    """One kernel for the interrupt tests: after each interrupt it goes on serving cells."""
    started = Kernel(tmp_path_factory.mktemp("kernel"), ipython)
    started.value("import time\nimport skyward_iac as sky\n"
                  "@sky.function\ndef long_task():\n"
                  "    print('task started', flush=True)\n    time.sleep(600)\n")
    yield started
    started.shutdown()


POOL_CELL = """
with sky.Compute(provider=sky.Local(), nodes=1, options=sky.Options(console="log")) as pool:
    long_task() >> pool
"""


@pytest.mark.integration
@pytest.mark.parametrize(("marker", "reached"), [
    (r"pulumi up \[\d", None),                          # during `pulumi up`
    (r"node 0: bootstrap \[\d/", "node 0: bootstrap"),  # during the node's bootstrap
    (r"^\[node 0\] task started$", "ready: 1 node"),    # while a task runs
], ids=["up", "bootstrap", "task"])
def test_the_stop_button_tears_the_pool_down(kernel: Kernel, marker: str,
                                             reached: str | None) -> None:
    running = kernel.run(POOL_CELL)
    stack = kernel.wait_for(running, STACK).group(1)
    kernel.wait_for(running, marker)
    kernel.interrupt()
    error = kernel.wait(running, timeout=180)
    assert error is not None and error["ename"] == "KeyboardInterrupt", error
    # The phase it hit: the milestone before it was reached, the one after it was not. (Not
    # "pulumi up done": the engine finishes the steps under way after an interrupt.)
    milestones = ["node 0: bootstrap", "ready: 1 node"]
    printed = kernel.text(running)
    assert [m for m in milestones if m in printed] == milestones[:milestones.index(reached) + 1
                                                               if reached else 0]
    assert f"stack {stack} destroyed in" in kernel.text(running)
    wait_until_gone(stack, timeout=30)
    assert "interrupted (Ctrl+C)" in (ClusterStack.select(stack).history()[0].message or "")
    assert kernel.value("print(1 + 1)") == "2"  # the kernel lives on
    assert reapers_of(kernel.pid), "the interrupt must not reach the kernel's reaper"


CHATTY = """
@sky.function
def chatty(tag: str, pause: float) -> str:
    import time
    print(f"{tag} start", flush=True)
    time.sleep(pause)
    print(f"{tag} end", flush=True)
    return tag
"""


@pytest.mark.integration
def test_a_session_pool_serves_many_cells_and_the_kernel_shutdown_destroys_it(
        ipython: Path, tmp_path: Path) -> None:
    kernel = Kernel(tmp_path, ipython)
    try:
        kernel.value("import skyward_iac as sky\n" + CHATTY)
        opened = kernel.value("session = sky.Session()\n"
                              "pool = session.compute(provider=sky.Local(), nodes=2, "
                              "options=sky.Options(console='log'))\nprint(pool.stack_name)")
        stack = re.search(STACK, opened).group(1)  # type: ignore[union-attr]
        # A task started in one cell (async) that prints after the next cell began: its lines
        # belong to the cell that ran it, not to the one running when they arrive.
        early = kernel.run("late = chatty('from-early', 3) > pool\n"
                           "print(chatty('early-sync', 0) >> pool)")
        assert kernel.wait(early) is None
        # This cell runs while that task prints its last line (it waits for its result).
        later = kernel.run("print(chatty('from-later', 0) >> pool, late.result())")
        assert kernel.wait(later) is None
        kernel.settle(1)
        assert re.search(r"^\[node \d\] from-early end$", kernel.text(early), re.MULTILINE), \
            kernel.text(early)
        assert not re.search(r"^\[node \d\] from-early", kernel.text(later), re.MULTILINE)
        assert re.search(r"^\[node \d\] from-later end$", kernel.text(later), re.MULTILINE)
        assert re.search(r"^\[node \d\] early-sync end$", kernel.text(early), re.MULTILINE)
        assert kernel.text(later, "stdout").splitlines()[-1] == "from-later from-early"
        assert stack_processes(stack)
        (reaper,) = reapers_of(kernel.pid)
    finally:
        kernel.shutdown()
    assert not is_alive(kernel.pid)
    wait_until_gone(stack, timeout=90)
    assert f"kernel (pid {kernel.pid}) ended" in (
        ClusterStack.select(stack).history()[0].message or "")
    deadline = time.monotonic() + 30
    while is_alive(reaper) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not is_alive(reaper), "the reaper exits once the kernel's stacks are destroyed"
