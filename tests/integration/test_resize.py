"""``pool.resize`` on real Local pools: a fixed pool grows and shrinks through stack updates
with the engine's progress on the console; an elastic pool takes new bounds; a request the
pool cannot take is an error, never silence."""

from __future__ import annotations

import pytest

import skyward_iac as sky
from skyward_iac.infra.stack import ClusterStack


@sky.function
def whoami() -> int:
    return sky.instance_info().node


@sky.function
def total() -> int:
    return sky.instance_info().total_nodes


def test_a_fixed_pool_grows_and_shrinks_with_engine_progress_on_the_console(
        capfd: pytest.CaptureFixture[str]) -> None:
    seen: list[sky.Event] = []
    compute = sky.Compute(provider=sky.Local(), nodes=1, options=sky.Options(console="log"))
    compute.on(sky.Event, seen.append)  # subscribed before entering: provisioning is seen too
    with compute as pool:
        name = pool.stack_name
        capfd.readouterr()
        pool.resize(3)
        grown = capfd.readouterr().err
        assert pool.current_nodes() == 3
        assert sorted(whoami() @ pool) == [0, 1, 2]
        assert total() @ pool == [3, 3, 3]  # every node was told the new size
        assert ClusterStack.select(name).resource_count() >= 4  # credentials + 3 nodes
        assert "create node-2 (LocalNode)" in grown, grown  # the engine's progress, live
        assert ClusterStack.select(name).tags()["nodes"] == "3"  # tags say what runs now
        pool.resize(1)
        shrunk = capfd.readouterr().err
        assert pool.current_nodes() == 1
        assert whoami() @ pool == [0]
        assert "delete node-2 (LocalNode)" in shrunk, shrunk
        assert ClusterStack.select(name).tags()["nodes"] == "1"
        history = ClusterStack.select(name).history()
        assert any("resize 1 -> 3" in (u.message or "") for u in history)
        assert any("resize 3 -> 1" in (u.message or "") for u in history)
    assert any(isinstance(e, sky.ClusterReady) for e in seen)


def test_an_elastic_pool_takes_new_bounds_and_refuses_a_count_outside_them() -> None:
    options = sky.Options(console=False, reconcile_tick_interval=600)
    with sky.Compute(provider=sky.Local(), nodes=sky.Nodes(desired=1, max=2),
                     options=options) as pool:
        with pytest.raises(sky.ConfigError, match="outside this elastic pool's bounds 1..2"):
            pool.resize(3)
        assert pool.current_nodes() == 1  # refused: nothing changed
        pool.resize(sky.Nodes(desired=3, min=1, max=4))
        assert pool.current_nodes() == 3
        with pytest.raises(sky.ConfigError):
            pool.resize(0)
        with pytest.raises(sky.ConfigError):
            pool.resize("2")  # type: ignore[arg-type]
