"""Parallel execution: gather() for a dynamic set of calls, & for a typed fixed set, and
streaming results as they complete (ordered or in completion order)."""

import time

import skyward_iac as sky


@sky.function
def process_chunk(data: list[int]) -> int:
    return sum(data)


@sky.function
def multiply(x: int, y: int) -> int:
    return x * y


@sky.function
def slow(seconds: float, label: str) -> str:
    time.sleep(seconds)
    return label


if __name__ == "__main__":
    with sky.Compute(provider=sky.Local(), nodes=2) as pool:
        chunks = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
        print("chunk sums:", sky.gather(*[process_chunk(c) for c in chunks]) >> pool)

        a, b = (multiply(2, 3) & multiply(4, 5)) >> pool
        print("products:", a, b)

        s, p = (process_chunk([1, 2, 3]) & multiply(10, 20)) >> sky  # `sky` = the active pool
        print("mixed:", s, p)

        started = time.monotonic()
        tasks = [slow(1.0, "slow"), slow(0.1, "fast"), slow(0.3, "medium")]
        for label in sky.gather(*tasks, stream=True, ordered=False) >> pool:
            print(f"  [{time.monotonic() - started:.1f}s] completed: {label}")

        print("map:", pool.map(lambda x: x * x, range(8)))
