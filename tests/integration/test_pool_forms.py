"""Session, @sky.pool and MultiPool each provision real stacks and destroy them."""

from __future__ import annotations

import skyward_iac as sky
from skyward_iac.infra.stacks.stack import ClusterStack


@sky.function
def node_count() -> int:
    info = sky.instance_info()
    if info is None:  # not `assert`: pytest rewrites asserts with helpers nodes lack
        raise RuntimeError("not on a node")
    return info.total_nodes


def destroyed(name: str) -> bool:
    return ClusterStack.select(name).resource_count() == 0


def test_session_manages_pool_lifetimes() -> None:
    with sky.Session() as session:
        first = session.compute(provider=sky.Local(), nodes=1)
        assert (node_count() >> first) == 1
        session.release(first)
        assert destroyed(first.stack_name)
        second = session.compute(provider=sky.Local(), nodes=1)
        assert (node_count() >> second) == 1
    assert destroyed(second.stack_name)


def test_pool_decorator_resolves_sky_inside() -> None:
    seen: list[str] = []

    @sky.pool(provider=sky.Local(), nodes=2)
    def job() -> int:
        from skyward_iac.api.function import active_pool

        seen.append(active_pool.get().stack_name)  # type: ignore[union-attr]
        return node_count() >> sky

    assert job() == 2
    assert destroyed(seen[0])


def test_multipool_provisions_concurrently_and_destroys_all() -> None:
    with sky.MultiPool(
        sky.Compute(provider=sky.Local(), nodes=1), sky.Compute(provider=sky.Local(), nodes=2)
    ) as (small, large):
        assert (node_count() >> small, node_count() >> large) == (1, 2)
        names = [small.stack_name, large.stack_name]
    assert all(destroyed(n) for n in names)
