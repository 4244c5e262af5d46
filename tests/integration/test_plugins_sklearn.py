"""joblib and scikit-learn on a real 2-node Local pool: inside ``with sky.Compute(...,
plugins=[sky.plugins.sklearn()])`` joblib's tasks run on the nodes."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from typing import Any

import joblib
import pytest
from sklearn.datasets import load_iris
from sklearn.model_selection import GridSearchCV
from sklearn.tree import DecisionTreeClassifier

import skyward_iac as sky

pytestmark = pytest.mark.integration
GRID = {"max_depth": [1, 2, 3, 4], "min_samples_leaf": [1, 5]}


def recording_accuracy(estimator: Any, features: Any, labels: Any) -> float:
    """The estimator's accuracy; on a node, also which node scored it."""
    info = sky.instance_info()
    if info is not None:
        sky.set("grid-nodes").add(info.node)
        sky.counter("grid-fits").increment()
    return float(estimator.score(features, labels))


def square_on(x: int) -> tuple[int, int | None]:
    info = sky.instance_info()
    return x * x, info.node if info else None


def grid_search() -> GridSearchCV:
    features, labels = load_iris(return_X_y=True)
    search = GridSearchCV(DecisionTreeClassifier(random_state=0), GRID, cv=3, n_jobs=-1,
                          scoring=recording_accuracy)
    return search.fit(features, labels)


@pytest.fixture(scope="module")
def sklearn_pool() -> Iterator[sky.Pool]:
    with sky.Compute(provider=sky.Local(), nodes=2, plugins=[sky.plugins.sklearn()],
                     options=sky.Options(default_compute_timeout=120)) as pool:
        yield pool


def test_grid_search_runs_its_candidates_on_the_nodes(sklearn_pool: sky.Pool) -> None:
    local = contextvars.Context().run(_local_grid_search)
    remote = grid_search()
    assert remote.best_params_ == local.best_params_
    assert remote.best_score_ == pytest.approx(local.best_score_)
    candidates = len(GRID["max_depth"]) * len(GRID["min_samples_leaf"])
    # Every (candidate, fold) was scored on a node, both nodes took part.
    assert sklearn_pool.counter("grid-fits").value == candidates * 3
    assert {0, 1} <= {int(n) for n in _members(sklearn_pool.set("grid-nodes"), (0, 1))}


def _local_grid_search() -> GridSearchCV:
    with joblib.parallel_config(backend="sequential"):
        return grid_search()


def _members(collection: Any, candidates: tuple[int, ...]) -> list[int]:
    return [c for c in candidates if c in collection]


def test_joblib_parallel_uses_every_slot_in_order(sklearn_pool: sky.Pool) -> None:
    results = joblib.Parallel(n_jobs=-1)(joblib.delayed(square_on)(i) for i in range(8))
    assert [value for value, _ in results] == [i * i for i in range(8)]
    assert {node for _, node in results} == {0, 1}
    backend, n_jobs = joblib.parallel.get_active_backend()
    assert type(backend).__name__ == "PoolBackend"
    assert backend.effective_n_jobs(-1) == 2
