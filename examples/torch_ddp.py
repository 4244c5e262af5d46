"""PyTorch DDP on 2 nodes with ``sky.plugins.torch``: the plugin installs torch on the nodes
and sets MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, so each node's task just calls
``dist.init_process_group``. Each rank reads its own slice of the data through
``sky.DistributedSampler``; an all_reduce checks the wiring, a few DDP steps train a linear
model, and the client (which needs no torch) compares what the ranks return."""

import os

import skyward_iac as sky

IMAGE = sky.Image(bootstrap_timeout=280)  # the first install downloads torch (~3 GB)


@sky.function
def train(epochs: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group(os.environ["SKYWARD_TORCH_BACKEND"])  # gloo on CPU nodes
    try:
        rank = dist.get_rank()
        check = torch.tensor([rank + 1.0])
        dist.all_reduce(check)  # 1 + 2 on every rank

        generator = torch.Generator().manual_seed(0)  # the same dataset on every node
        features = torch.randn(256, 3, generator=generator)
        targets = features @ torch.tensor([[2.0], [-1.0], [0.5]]) + 0.3
        sampler = sky.DistributedSampler(range(len(features)), seed=0)
        model = DistributedDataParallel(torch.nn.Linear(3, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            mine = list(sampler)
            loss = ((model(features[mine]) - targets[mine]) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        weights = [round(w, 6) for w in model.module.weight.detach().flatten().tolist()]
        return {"rank": rank, "check": check.item(), "rows": len(sampler), "weights": weights,
                "loss": round(loss.item(), 4)}
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    with sky.Compute(provider=sky.Local(), nodes=2, image=IMAGE,
                     plugins=[sky.plugins.torch(version="2.15.0")],
                     options=sky.Options(cluster=False)) as pool:
        ranks = train(epochs=30) @ pool
    for r in ranks:
        print(f"rank {r['rank']}: {r['rows']} rows, loss {r['loss']}, weights {r['weights']}")
    print(f"all_reduce sum on every rank: {[r['check'] for r in ranks]}")
    print(f"parameters identical on {len(ranks)} ranks: "
          f"{all(r['weights'] == ranks[0]['weights'] for r in ranks)}")
