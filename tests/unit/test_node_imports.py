"""The node side's import set is declared (``skyward_iac.node.IMPORTS``) and checked: the
transitive closure of the node entry points, computed from the source by grimp (what
import-linter uses), must equal the declared set, and a process that loads every role imports
nothing outside it. The import contract (pyproject.toml) separately keeps the node package off
every client-side package."""

from __future__ import annotations

import json
import subprocess
import sys

import grimp

from skyward_iac.node import IMPORTS, ROLES


def _closure(graph: grimp.ImportGraph, roots: list[str]) -> set[str]:
    """Every skyward_iac module the roots reach, counting each module's parent packages (whose
    ``__init__`` runs first) and imports inside functions."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen or module.split(".")[0] != "skyward_iac":
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += graph.find_modules_directly_imported_by(module)
    return seen


def test_the_node_entry_points_import_exactly_the_declared_set() -> None:
    graph = grimp.build_graph("skyward_iac", exclude_type_checking_imports=True)
    found = _closure(graph, ["skyward_iac.node.__main__", *ROLES.values()])
    assert found == IMPORTS, (
        f"the node side now reaches {sorted(found - IMPORTS)} and no longer "
        f"{sorted(IMPORTS - found)}: update skyward_iac.node.IMPORTS if that is meant")


def test_a_node_process_loads_nothing_undeclared() -> None:
    script = ("import importlib, json, sys\n"
              f"for name in {sorted(ROLES.values())!r}: importlib.import_module(name)\n"
              "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'skyward_iac')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    loaded = set(json.loads(done.stdout))
    assert "skyward_iac.node.agent" in loaded
    assert loaded <= IMPORTS, f"loaded but not declared: {sorted(loaded - IMPORTS)}"


def test_every_role_runs_through_the_one_entry_point() -> None:
    for role in ROLES:
        done = subprocess.run([sys.executable, "-m", "skyward_iac.node", role, "--help"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert f"python -m skyward_iac.node {role}" in done.stdout
    wrong = subprocess.run([sys.executable, "-m", "skyward_iac.node", "nope"],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "usage: python -m skyward_iac.node" in wrong.stderr
