"""Broadcast + shard: every node receives the whole dataset, processes its own slice, and the
client adds the partial results up (the map-reduce pattern)."""

import skyward_iac as sky


@sky.function
def process_partition(data: list[int]) -> dict:
    info = sky.instance_info()
    local = sky.shard(data)  # this node's slice: data[node::total_nodes]
    if sky.is_head(info):
        print(f"head node sees {info.total_nodes} nodes, peers {[p.private_ip for p in info.peers]}")
    return {"node": info.node, "size": len(local), "sum": sum(local)}


if __name__ == "__main__":
    with sky.Compute(provider=sky.Local(), nodes=3) as pool:
        data = list(range(1000))
        results = process_partition(data) @ pool
        total = 0
        for r in results:
            print(f"  node {r['node']}: {r['size']} items, sum={r['sum']}")
            total += r["sum"]
        print(f"total: {total} (expected: {sum(data)})")
