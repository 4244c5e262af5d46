"""``sky.DistributedSampler``: this worker's indices of a dataset, epoch after epoch."""

from __future__ import annotations

from collections.abc import Iterator, Sized

from skyward_iac.api.runtime import instance_info, shard


class DistributedSampler:
    """The indices of ``dataset`` this node reads, for ``torch.utils.data.DataLoader(sampler=)``
    or a plain loop.

    The same split as ``sky.shard(range(len(dataset)), ...)``: with ``shuffle`` every node draws
    the permutation of ``seed + epoch`` and takes every ``num_replicas``-th index from its
    ``rank``; ``drop_last`` gives every node the same count. ``rank``/``num_replicas`` default
    to this node and the pool's node count (0 and 1 outside a pool). Call ``set_epoch(n)``
    before each epoch for a new shuffle.
    """

    def __init__(self, dataset: Sized, *, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, num_replicas: int | None = None,
                 rank: int | None = None) -> None:
        info = instance_info()
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.num_replicas = num_replicas if num_replicas is not None else (
            info.total_nodes if info else 1)
        self.rank = rank if rank is not None else (info.node if info else 0)
        if self.num_replicas < 1 or not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank {self.rank} is outside 0..{self.num_replicas - 1}")
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently (and identically on every node) for ``epoch``."""
        self.epoch = epoch

    def indices(self) -> list[int]:
        """This node's indices for the current epoch."""
        if len(self.dataset) == 0:
            return []
        return list(shard(range(len(self.dataset)), shuffle=self.shuffle,
                          seed=self.seed + self.epoch, drop_last=self.drop_last,
                          node=self.rank, total_nodes=self.num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices())

    def __len__(self) -> int:
        total = len(self.dataset)
        if self.drop_last:
            return total // self.num_replicas
        return len(range(self.rank, total, self.num_replicas))
