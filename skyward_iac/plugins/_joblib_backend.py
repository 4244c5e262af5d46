"""The joblib parallel backend that runs each joblib batch as one task of a pool."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from joblib._parallel_backends import (  # type: ignore[import-untyped]
    ParallelBackendBase,
    SequentialBackend,
)

from skyward_iac.api.function import function
from skyward_iac.remote.calls import ship_module_by_value

if TYPE_CHECKING:
    from skyward_iac.orchestration.pool import Pool

#: How deep the backend looks into a batch for the user's own classes and functions.
SEARCH_DEPTH = 6


@function
def run_batch(batch: Callable[[], Any]) -> Any:
    """On a node: run one joblib batch (a ``BatchedCalls``)."""
    return batch()


class PoolBackend(ParallelBackendBase):
    """joblib tasks as pool tasks; ``n_jobs=-1`` is every slot of the pool."""

    supports_retrieve_callback = True
    supports_timeout = True
    uses_threads = False
    supports_sharedmem = False
    default_n_jobs = -1

    def __init__(self, pool: Pool, nesting_level: int | None = None,
                 inner_max_num_threads: int | None = None, **kwargs: Any) -> None:
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads, **kwargs)
        self.pool = pool

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        slots = max(1, self.pool.current_nodes() * self.pool.slots_per_node)
        if n_jobs is None or n_jobs < 0:
            return max(slots + 1 + (n_jobs or -1), 1)
        return n_jobs

    def submit(self, func: Callable[[], Any],
               callback: Callable[[Future[Any]], Any] | None = None) -> Future[Any]:
        _ship_user_code(func, SEARCH_DEPTH)
        future = self.pool.run_async(run_batch(func))
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def retrieve_result_callback(self, out: Future[Any]) -> Any:
        return out.result()

    def retrieve_result(self, out: Future[Any], timeout: float | None = None) -> Any:
        return out.result(timeout=timeout)

    def get_nested_backend(self) -> tuple[ParallelBackendBase, int | None]:
        # A node runs nested loops itself (one task's loop must not queue behind the pool).
        nesting = 0 if self.nesting_level is None else self.nesting_level + 1
        return SequentialBackend(nesting_level=nesting), None


def _ship_user_code(value: Any, depth: int) -> None:
    """Pickle by value the user's modules whose functions, classes or instances a batch
    carries (a scorer or an estimator defined next to the script); installed packages and
    skyward_iac itself are left alone."""
    if depth < 0 or isinstance(value, (str, bytes, int, float, bool, type(None))):
        return
    ship_module_by_value(value)  # a function's or class's module; an instance's class's
    if isinstance(value, (list, tuple, set, frozenset)):
        children = list(value)
    elif isinstance(value, dict):
        children = list(value.values())
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        children = list(vars(value).values())
    else:
        return
    for child in children[:64]:
        _ship_user_code(child, depth - 1)
