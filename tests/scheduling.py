"""How pytest-xdist cuts the suite into units of work, and in which order the units start.

scripts/test runs ``--dist loadfile --no-loadscope-reorder``; ``pytest_xdist_make_scheduler``
below replaces loadfile's scheduler with ``Units``. A unit is what one worker runs whole:

* a file, by default, as under loadfile: its module-scoped fixtures (a real etcd, a moto
  server, a pool) are started once;
* each test on its own in the files of ``SPREAD``, whose tests share no module fixture and no
  state: a long file's tests then run on both workers instead of one;
* the files of ``SHARED_POOLS`` together: they use the pools of tests/integration/conftest.py,
  which are closed when a worker's next test does not use them, so one unit makes each once.

Units start longest first (the seconds in tests/durations.json; a unit not in it gets a guess
from its directory and number of tests): with two workers the run ends when the last long unit
does, so a long unit started last leaves the other worker idle.

``SKYWARD_TEST_DURATIONS=path`` writes each unit's measured seconds (setup, call and teardown
of its tests) to ``path`` when the session ends, in the format read here: copy a whole CI
run's into tests/durations.json to refresh the order.

(xdist's own ``--dist loadgroup`` cannot do this with pytest 9: it renames items through
``item._nodeid``, an attribute pytest 9 no longer reads, so every test becomes its own unit.)
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

#: Files whose tests are independent units. Each test makes its own pool, server or child
#: process and leaves nothing behind (the chaos tests' leak check asserts it).
SPREAD = frozenset({
    "tests/integration/test_examples.py",
    "tests/integration/test_sealed_plans.py",
    "tests/integration/test_budget.py",
    "tests/integration/test_reviewed_plans.py",
    "tests/integration/test_resize.py",
    "tests/integration/test_team_leases.py",
    "tests/integration/test_team_backend.py",
    "tests/integration/test_partial_readiness.py",
    "tests/integration/test_pytest_plugin.py",
    "tests/integration/test_pool_forms.py",
    "tests/integration/test_preview.py",
    "tests/chaos/test_warm_pools.py",
    "tests/chaos/test_full_disk.py",
    "tests/chaos/test_engine_safety.py",
    "tests/chaos/test_skewed_clocks.py",
    "tests/chaos/test_lifecycle_chaos.py",
    "tests/chaos/test_pool_faults.py",
    "tests/chaos/test_local_nodes.py",
    "tests/chaos/test_destroy_path.py",
    "tests/chaos/test_forgotten_session.py",
    "tests/chaos/test_etcd_loss.py",
})
#: Files that use the shared pools of tests/integration/conftest.py (``pool``, ``process_pool``),
#: and the name of the one unit they make.
SHARED_POOLS = frozenset({
    "tests/integration/test_api.py",
    "tests/integration/test_dispatch.py",
    "tests/integration/test_pool_forward.py",
    "tests/integration/test_task_events.py",
})
SHARED_POOLS_UNIT = "tests/integration/conftest.py::shared pools"
#: Seconds each unit took in a whole run, read to order the units.
DURATIONS = Path(__file__).with_name("durations.json")
#: An unmeasured unit's guessed seconds, by the directory under tests/: (once, per test). An
#: integration file starts a pool or a server once and then runs quicker tests against it.
GUESS = {"unit": (0.0, 0.3), "docs": (5.0, 3.0), "integration": (15.0, 5.0),
         "chaos": (0.0, 30.0)}

_recorded: dict[str, float] = defaultdict(float)


def unit_of(nodeid: str) -> str:
    """The unit a test runs in: its file, the test itself in a file of ``SPREAD``, or the
    shared pools' unit."""
    path = nodeid.split("::", 1)[0]
    if path in SHARED_POOLS:
        return SHARED_POOLS_UNIT
    return nodeid if path in SPREAD else path


def _known() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def order(units: dict[str, int], known: dict[str, float]) -> list[str]:
    """Unit names (with their numbers of tests), longest first; ties keep collection order."""
    def seconds(name: str) -> float:
        if name in known:
            return known[name]
        parts = name.split("/")
        once, per_test = GUESS.get(parts[1] if len(parts) > 1 else "", (0.0, 1.0))
        return once + per_test * units[name]
    position = {name: i for i, name in enumerate(units)}
    return sorted(units, key=lambda name: (-seconds(name), position[name]))


def _distributed(config: pytest.Config) -> bool:
    return config.getoption("dist", "no") == "loadfile" or hasattr(config, "workerinput")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, every worker lists the items unit by unit, longest unit first; with
    ``--no-loadscope-reorder`` the scheduler hands the units out in that order."""
    if not _distributed(config):
        return
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item.nodeid), []).append(item)
    ranked = order({name: len(tests) for name, tests in units.items()}, _known())
    items[:] = [item for name in ranked for item in units[name]]


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown when xdist is not loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` hands out ``Units`` (above) rather than whole files."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return Units(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _recorded[unit_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("SKYWARD_TEST_DURATIONS")
    if not target or hasattr(session.config, "workerinput") or not _recorded:
        return
    ranked = sorted(_recorded.items(), key=lambda kv: -kv[1])
    Path(target).write_text(json.dumps({k: round(v, 1) for k, v in ranked}, indent=1) + "\n")
