"""Warm pool: the second ``with`` block gets the first one's nodes, already bootstrapped.

``Options(keep_warm=60)`` leaves a pool's nodes running, idle, for 60 seconds after its block
ends, kept by a small keeper process; the next ``Compute`` with an equal spec (in this process
or any other of the same user) takes them over in a fraction of a second, with no stack update
and no bootstrap. Unclaimed, the keeper destroys the stack when the time runs out. The last
pool here keeps nothing warm, so the example leaves nothing behind.
"""

import time

import skyward_iac as sky


@sky.function
def where() -> str:
    import os

    return f"node {sky.instance_info().node}, worker pid {os.getpid()}"


def run(keep_warm: float) -> tuple[float, list[str]]:
    started = time.monotonic()
    with sky.Compute(provider=sky.Local(), nodes=2,
                     options=sky.Options(keep_warm=keep_warm)) as pool:
        answers = where() @ pool
        return time.monotonic() - started, answers


if __name__ == "__main__":
    cold, first = run(keep_warm=60)
    warm, second = run(keep_warm=0)  # adopts the warm nodes, then destroys them at exit
    print(f"cold start to first results: {cold:.1f}s  {first}")
    print(f"warm start to first results: {warm:.2f}s  {second}")
    print(f"same workers: {first == second}")
