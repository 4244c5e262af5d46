"""``pool.resize`` on real Local pools: a fixed pool grows and shrinks through stack updates
with the engine's progress on the console; an elastic pool takes new bounds; a request the
pool cannot take is an error, never silence."""

from __future__ import annotations

import time
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.infra.stacks.stack import ClusterStack


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


def test_closing_a_pool_while_it_grows_logs_no_warning(
        capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 29 item 9: a normal shutdown during a stack update logged "WARNING ... node 0
    missed the new peer list: Socket is closed" (the nodes close before the update ends)."""
    import threading

    seen: list[sky.Event] = []
    compute = sky.Compute(provider=sky.Local(), nodes=1, options=sky.Options(console=False),
                          on_event=seen.append)
    with compute as pool:
        grow = threading.Thread(target=lambda: _quietly(pool.resize, 2), daemon=True)
        grow.start()
        deadline = time.monotonic() + 60
        while not any(isinstance(e, sky.InstanceLaunched) and e.node == 1 for e in seen):
            assert time.monotonic() < deadline, "the resize never reached the engine"
            time.sleep(0.02)
        capfd.readouterr()
    grow.join(60)
    err = capfd.readouterr().err
    assert "missed the new peer list" not in err, err
    assert "WARNING" not in err and "ERROR" not in err, err


def _quietly(step: Any, *args: Any) -> None:
    try:
        step(*args)
    except sky.SkywardError:
        pass  # the pool closed under the resize, as the test means it to
