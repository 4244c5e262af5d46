"""A large argument shared by many tasks crosses the wire once per node: 32 tasks on one 64 MB
array. Each node receives the bytes once; every later task there only names them, and maps the
node's copy privately (a task that writes its argument changes nothing another task sees).

Then a fresh array on every call (the batches of a stream): on the Local provider each goes in
shared memory the client reuses once the task that had it let go of it."""

import time

import numpy as np

import skyward_iac as sky


@sky.function
def total(batch: np.ndarray) -> float:
    return float(batch.sum())


@sky.function
def column_mean(data: np.ndarray, column: int) -> float:
    data[0, column] = 0.0  # private to this task: the next one still sees the original
    return float(data[1:, column].mean())


if __name__ == "__main__":
    data = np.random.default_rng(7).random((1_000_000, 8))  # 64 MB of float64
    expected = [float(data[1:, c % 8].mean()) for c in range(32)]
    with sky.Compute(provider=sky.Local(), nodes=2, image=sky.Image(pip=["numpy"])) as pool:
        started = time.monotonic()
        means = sky.gather(*(column_mean(data, c % 8) for c in range(32))) >> pool
        print(f"32 tasks on one {data.nbytes >> 20} MiB array in {time.monotonic() - started:.1f}s")
        batches = [np.random.default_rng(seed).random(4_000_000) for seed in range(8)]  # 32 MB
        started = time.monotonic()
        sums = [total(batch) >> pool for batch in batches]
        mib = sum(batch.nbytes for batch in batches) >> 20
        print(f"8 calls on fresh arrays: {mib / (time.monotonic() - started):.0f} MiB/s")
    print("means match the local ones:", np.allclose(means, expected))
    print("sums match the local ones:", np.allclose(sums, [batch.sum() for batch in batches]))
