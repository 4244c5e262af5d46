"""Multi-host JAX with ``sky.plugins.jax``: one JAX process per node, the head as coordinator.
``jax.distributed.initialize()`` needs no arguments inside the task; every process then sees
the devices of all nodes and gathers a value from each."""

import skyward_iac as sky

IMAGE = sky.Image(bootstrap_timeout=280)


@sky.function
def cross_process_sum() -> dict:
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    jax.distributed.initialize()
    try:
        mine = jnp.array([10.0 * (jax.process_index() + 1)])
        everyone = multihost_utils.process_allgather(mine)
        return {"process": jax.process_index(), "processes": jax.process_count(),
                "devices": jax.device_count(), "sum": float(everyone.sum())}
    finally:
        jax.distributed.shutdown()


if __name__ == "__main__":
    # jax 0.10.2 is the newest release for Python 3.11 (0.11+ needs 3.12).
    with sky.Compute(provider=sky.Local(), nodes=2, image=IMAGE,
                     plugins=[sky.plugins.jax(version="0.10.2")],
                     options=sky.Options(cluster=False)) as pool:
        results = cross_process_sum() @ pool
    for r in results:
        print(f"process {r['process']} of {r['processes']}: {r['devices']} devices in total")
    print(f"cross-process sum on every process: {[r['sum'] for r in results]}")
