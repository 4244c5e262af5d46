"""Figure 5: shared state from inside tasks, operations per second.

skyward_iac: its etcd-backed collections (strong counter from both nodes at once; dict gets
per node, strong and eventual; lock acquire+release and queue put+get pairs on one node, and
lock pairs from both nodes at once on one lock, where every acquire but the first waits).
Peers: what each offers for the same job (a Ray actor and ``ray.util.queue``; Dask's
``Variable``/``Lock``/``Queue``; ``multiprocessing.Manager`` proxies for the process pool);
"—" where a peer has no such primitive.
"""

from __future__ import annotations

from typing import Any

from common import Row

SECONDS = 1.0

FIGURES = [
    ("counter", "5. counter increments (strong, 2 nodes)", None),
    ("dict-strong", "5. dict get, strong (per node)", None),
    ("dict-eventual", "5. dict get, eventual (per node)", 100_000),
    ("lock", "5. lock acquire+release", None),
    ("lock-contended", "5. lock acquire+release, 2 nodes contending", None),
    ("queue", "5. queue put+get", None),
]


def measure(system: Any, seconds: float = SECONDS) -> dict[str, float | None]:
    """Each primitive's operations per second (None: the system has none)."""
    return system.collections(seconds)


def rows(results: dict[str, dict[str, float | None]]) -> list[Row]:
    """Figure 5's rows."""
    return [
        Row(label, "ops/s", "higher", target, {name: r.get(key) for name, r in results.items()})
        for key, label, target in FIGURES
    ]
