"""scikit-learn on the pool with ``sky.plugins.sklearn``: inside the ``with`` block joblib's
default backend sends work to the nodes, so ``GridSearchCV(n_jobs=-1)`` fits its candidates
there (the plugin installs the client's scikit-learn, joblib, numpy and scipy on the nodes).
A counter shows how many fits each node ran; the result matches a local run."""

import joblib
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV
from sklearn.svm import SVC

import skyward_iac as sky

GRID = {"C": [0.1, 1, 10], "gamma": [0.0005, 0.001, 0.005]}


def accuracy(estimator, features, labels) -> float:
    """The scorer; on a node it also counts the fit on that node's counter."""
    info = sky.instance_info()
    if info is not None:
        sky.counter(f"fits-on-node-{info.node}").increment()
    return estimator.score(features, labels)


def search() -> GridSearchCV:
    features, labels = load_digits(return_X_y=True)
    grid = GridSearchCV(SVC(), GRID, cv=3, n_jobs=-1, scoring=accuracy)
    return grid.fit(features, labels)


if __name__ == "__main__":
    with joblib.parallel_config(backend="sequential"):
        local = search()
    with sky.Compute(provider=sky.Local(), nodes=2,
                     plugins=[sky.plugins.sklearn()]) as pool:
        remote = search()
        fits = {node: pool.counter(f"fits-on-node-{node}").value for node in range(2)}
    print(f"best params: {remote.best_params_} (score {remote.best_score_:.4f})")
    print(f"fits per node: {fits} of {len(GRID['C']) * len(GRID['gamma']) * 3}")
    print(f"best params match the local run: {remote.best_params_ == local.best_params_}")
