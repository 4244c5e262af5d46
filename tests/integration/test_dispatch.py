"""Tasks on a real 2-node Local pool: round trips, errors with remote tracebacks, timeouts."""

from __future__ import annotations

import os
import threading
import time

import pytest

import skyward_iac as sky


@sky.function
def where(x: int) -> dict:
    import os
    import socket

    return {
        "x": x,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "sandbox": os.environ.get("SKYWARD_LOCAL_SANDBOX"),
    }


@sky.function
def fail(message: str) -> None:
    raise ValueError(message)


class NeedsTwoArgs(Exception):
    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}+{b}")


@sky.function
def fail_unrebuildable() -> None:
    raise NeedsTwoArgs(1, 2)


@sky.function
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_round_trip_runs_on_a_node_process(pool: sky.Pool) -> None:
    result = where(21) >> pool
    assert result["x"] == 21
    assert result["pid"] != os.getpid()
    assert result["sandbox"], "the task did not run inside a Local node's SSH session"


def test_round_robin_reaches_every_node(pool: sky.Pool) -> None:
    sandboxes = {(where(i) >> pool)["sandbox"] for i in range(4)}
    assert len(sandboxes) == 2


def test_dispatch_to_the_sky_module_inside_the_block(pool: sky.Pool) -> None:
    assert (where(5) >> sky)["x"] == 5


def test_broadcast_returns_one_result_per_node_in_order(pool: sky.Pool) -> None:
    results = where(1) @ pool
    assert [r["x"] for r in results] == [1, 1]
    assert len({r["sandbox"] for r in results}) == 2
    assert results[0]["sandbox"].endswith("node-0") and results[1]["sandbox"].endswith("node-1")


def test_target_pins_a_node(pool: sky.Pool) -> None:
    assert pool.run(where(0), target=1)["sandbox"].endswith("node-1")
    assert pool.run(where(0), target="head")["sandbox"].endswith("node-0")
    with pytest.raises(sky.ConfigError, match="target must be"):
        pool.run(where(0), target=7)


def test_async_dispatch_returns_a_future(pool: sky.Pool) -> None:
    future = nap(0.2) > pool
    assert future.result(timeout=30) == 0.2


def test_remote_exception_keeps_its_type_and_remote_traceback(pool: sky.Pool) -> None:
    with pytest.raises(ValueError, match="boom on the node") as caught:
        fail("boom on the node") >> pool
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "Remote traceback (node" in notes
    assert "in fail" in notes and "raise ValueError(message)" in notes


def test_exception_that_cannot_be_rebuilt_becomes_remote_error(pool: sky.Pool) -> None:
    with pytest.raises(sky.RemoteError) as caught:
        fail_unrebuildable() >> pool
    assert caught.value.type_name.endswith("NeedsTwoArgs")
    assert "1+2" in str(caught.value)
    assert "raise NeedsTwoArgs(1, 2)" in caught.value.remote_traceback


def test_timeout_names_the_function_and_limit(pool: sky.Pool) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"nap did not finish within its timeout of 0.5s"):
        nap(3).with_timeout(0.5) >> pool
    assert time.monotonic() - started < 2.5
    assert (nap(0) >> pool) == 0  # the pool keeps serving


def test_function_timeout_from_the_decorator(pool: sky.Pool) -> None:
    short = sky.function(timeout=0.3)(nap.fn)
    with pytest.raises(TimeoutError, match="0.3s"):
        short(2) >> pool


def test_unpicklable_argument_is_named_before_dispatch(pool: sky.Pool) -> None:
    with pytest.raises(sky.ConfigError, match=r"argument 0 \(lock\) cannot be pickled"):
        where(threading.Lock()) >> pool


def test_finished_calls_are_freed_without_the_garbage_collector(pool: sky.Pool) -> None:
    """A call and its submission must not form a reference cycle: in a fast map the
    collector's runs cost ~40% of the client's CPU when they did."""
    import gc

    from skyward_iac.orchestration.dispatch import Call as _Call
    from skyward_iac.remote.agent_client import Submission

    pool.map(lambda x: x, range(50))
    gc.collect()
    gc.disable()
    try:
        assert pool.map(lambda x: x, range(300)) == list(range(300))
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, _Call | Submission)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cyclic == []
