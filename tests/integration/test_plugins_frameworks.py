"""PyTorch DDP (gloo), Accelerate and multi-host JAX across 2 real Local nodes, set up by
``sky.plugins.torch``, ``sky.plugins.accelerate`` and ``sky.plugins.jax`` on one pool. The
client has none of these frameworks: tasks return plain Python values."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import skyward_iac as sky

pytestmark = pytest.mark.integration
TORCH = "2.15.0"
#: The newest JAX for the client's Python 3.11 (0.11+ needs 3.12).
JAX = "0.10.2"
ACCELERATE = "1.15.0"


@pytest.fixture(scope="module")
def frameworks() -> Iterator[sky.Pool]:
    image = sky.Image(bootstrap_timeout=280)
    plugins = [sky.plugins.torch(version=TORCH), sky.plugins.jax(version=JAX),
               sky.plugins.accelerate({"mixed_precision": "no"}, version=ACCELERATE)]
    with sky.Compute(provider=sky.Local(), nodes=2, image=image, plugins=plugins,
                     options=sky.Options(default_compute_timeout=120, cluster=False)) as pool:
        yield pool


# ---- accelerate -------------------------------------------------------------------------------

@sky.function
def accelerate_gather() -> dict[str, Any]:
    import os

    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    gathered = accelerator.gather(torch.tensor([accelerator.process_index + 1.0]))
    flags = os.environ["SKYWARD_ACCELERATE_FLAGS"]
    accelerator.end_training()
    return {"index": accelerator.process_index, "processes": accelerator.num_processes,
            "type": str(accelerator.distributed_type), "gathered": gathered.tolist(),
            "flags": flags}


def test_accelerate_sees_the_whole_cluster(frameworks: sky.Pool) -> None:
    # First in the module: its process group is the first of these worker processes.
    results = accelerate_gather() @ frameworks
    assert [r["index"] for r in results] == [0, 1]
    for node, result in enumerate(results):
        assert (result["processes"], result["type"]) == (2, "DistributedType.MULTI_CPU")
        assert result["gathered"] == [1.0, 2.0]
        assert f"--num_machines 2 --machine_rank {node}" in result["flags"]


# ---- torch --------------------------------------------------------------------------------------

@sky.function
def all_reduce() -> dict[str, Any]:
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group(os.environ["SKYWARD_TORCH_BACKEND"])
    try:
        rank = dist.get_rank()
        tensor = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])
        dist.all_reduce(tensor)
        return {"rank": rank, "world": dist.get_world_size(), "sum": tensor.tolist(),
                "backend": dist.get_backend(), "torch": torch.__version__.split("+")[0],
                "env": {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK",
                                                   "WORLD_SIZE", "LOCAL_RANK",
                                                   "LOCAL_WORLD_SIZE")}}
    finally:
        dist.destroy_process_group()


@sky.function
def ddp_step() -> dict[str, Any]:
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group(os.environ["SKYWARD_TORCH_BACKEND"])
    try:
        rank = dist.get_rank()
        torch.manual_seed(rank)  # different initial weights: DDP must broadcast rank 0's
        model = torch.nn.Linear(4, 1)
        ddp = DistributedDataParallel(model)
        before = [p.detach().flatten().tolist() for p in model.parameters()]
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        data = torch.Generator().manual_seed(100 + rank)  # each rank sees different data
        features, targets = torch.randn(8, 4, generator=data), torch.randn(8, 1, generator=data)
        loss = ((ddp(features) - targets) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        after = [p.detach().flatten().tolist() for p in model.parameters()]
        return {"rank": rank, "before": before, "after": after}
    finally:
        dist.destroy_process_group()


def test_all_reduce_gives_the_exact_sum_on_every_rank(frameworks: sky.Pool) -> None:
    results = all_reduce() @ frameworks
    assert [r["rank"] for r in results] == [0, 1]
    for result in results:
        assert result["sum"] == [3.0, 30.0]  # (1 + 2, 10 + 20): exact in float32
        assert (result["world"], result["backend"], result["torch"]) == (2, "gloo", TORCH)
    head, other = (r["env"] for r in results)
    assert head["MASTER_ADDR"] == other["MASTER_ADDR"] and head["MASTER_PORT"] == other["MASTER_PORT"]
    assert int(head["MASTER_PORT"]) not in (2379, 2380)
    assert [head["RANK"], other["RANK"]] == ["0", "1"]
    assert (head["WORLD_SIZE"], head["LOCAL_RANK"], head["LOCAL_WORLD_SIZE"]) == ("2", "0", "1")


def test_a_ddp_step_keeps_parameters_identical_across_ranks(frameworks: sky.Pool) -> None:
    head, other = ddp_step() @ frameworks
    # Different seeds gave different weights; DDP started both from rank 0's.
    assert head["before"] == other["before"]
    # Different data, averaged gradients: the step moved both ranks identically.
    assert head["after"] == other["after"]
    assert head["after"] != head["before"]


# ---- jax ----------------------------------------------------------------------------------------

@sky.function
def cross_process_sum() -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    jax.distributed.initialize()  # coordinator, count and id come from the plugin
    try:
        mine = jnp.array([jax.process_index() + 1.0])
        gathered = multihost_utils.process_allgather(mine)
        return {"process": jax.process_index(), "processes": jax.process_count(),
                "devices": jax.device_count(), "sum": float(gathered.sum()),
                "version": jax.__version__}
    finally:
        jax.distributed.shutdown()


def test_two_jax_processes_compute_a_cross_process_sum(frameworks: sky.Pool) -> None:
    results = cross_process_sum() @ frameworks
    assert [r["process"] for r in results] == [0, 1]
    for result in results:
        assert (result["processes"], result["devices"]) == (2, 2)
        assert result["sum"] == 3.0  # 1 (process 0) + 2 (process 1), seen by both
        assert result["version"] == JAX
