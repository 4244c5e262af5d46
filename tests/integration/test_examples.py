"""Every script in examples/ runs to completion on the Local provider and prints its results."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXPECTED = {
    "quickstart.py": "squares: [0, 1, 4, 9, 16]",
    "parallel.py": "chunk sums: (6, 15, 24)",
    "broadcast_shard.py": "total: 499500 (expected: 499500)",
    "async_tasks.py": "on the head node: 285",
    "shared_state.py": "processed: 60 of 60",
    "storage_checkpoint.py": "checkpoints downloaded: 2 of 2",
    "torch_ddp.py": "parameters identical on 2 ranks: True",
    "jax_distributed.py": "cross-process sum on every process: [30.0, 30.0]",
    "sklearn_grid_search.py": "best params match the local run: True",
    "elastic_pool.py": "grew to 3 and shrank back to 1",
    "preemption_recovery.py": "node 1 serves again: 49",
    "warm_pool.py": "same workers: True",
    "container_image.py": "cuda image: nvidia/cuda:12.8.1-runtime-ubuntu24.04",
    "tensorboard_forward.py": "forwarded page reached: True",
    "budget.py": "stopped by the budget: True",
    "large_argument.py": "sums match the local ones: True",
}


def test_every_example_is_covered() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=240,
        env={**os.environ}, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert EXPECTED[name] in done.stdout
