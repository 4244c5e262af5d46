"""The suite's xdist units and their order (tests/scheduling.py), as pure functions."""

from __future__ import annotations

from tests import scheduling

EXAMPLE = "tests/integration/test_examples.py::test_example_runs[budget.py]"
ETCD = "tests/integration/test_collections_etcd.py::test_async_twins"


def test_a_file_is_one_unit_unless_its_tests_are_independent() -> None:
    assert scheduling.unit_of(ETCD) == "tests/integration/test_collections_etcd.py"
    assert scheduling.unit_of("tests/unit/test_pacing.py::test_a") == "tests/unit/test_pacing.py"
    assert scheduling.unit_of(EXAMPLE) == EXAMPLE
    assert scheduling.unit_of("tests/chaos/test_warm_pools.py::test_one_adopter_at_a_time") \
        == "tests/chaos/test_warm_pools.py::test_one_adopter_at_a_time"

    # The files that use the integration conftest's shared pools run as one unit, so a worker
    # makes each pool once.
    assert {scheduling.unit_of(f"{path}::test_x") for path in scheduling.SHARED_POOLS} \
        == {scheduling.SHARED_POOLS_UNIT}


def test_units_start_longest_first_measured_or_guessed() -> None:
    units = {"tests/unit/test_a.py": 40, "tests/unit/test_b.py": 40,
             "tests/integration/test_c.py": 3, EXAMPLE: 1, "tests/chaos/test_d.py::t": 1}
    known = {EXAMPLE: 50.0}
    # Guesses: unit files 12 s each (40 x 0.3), the integration file 15 + 3 x 5 = 30 s, the
    # chaos test 30 s; the tie of the two unit files keeps their collection order, and so does
    # that of the integration file and the chaos test.
    assert scheduling.order(units, known) == [
        EXAMPLE, "tests/integration/test_c.py", "tests/chaos/test_d.py::t",
        "tests/unit/test_a.py", "tests/unit/test_b.py"]


def test_every_spread_file_exists() -> None:
    root = scheduling.DURATIONS.parents[1]
    assert all((root / path).is_file() for path in scheduling.SPREAD | scheduling.SHARED_POOLS)
    assert not scheduling.SPREAD & scheduling.SHARED_POOLS
