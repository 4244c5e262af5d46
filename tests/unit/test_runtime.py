"""shard(), InstanceInfo and output control, without a pool."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

import skyward_iac as sky
from skyward_iac.api import runtime
from skyward_iac.api.runtime import redirect_output


def info(node: int, total: int) -> sky.InstanceInfo:
    peers = [sky.PeerInfo(node=i, private_ip=f"10.0.0.{i}", public_ip=f"1.2.3.{i}") for i in range(total)]
    return sky.InstanceInfo(node=node, total_nodes=total, head_addr="10.0.0.0", head_port=2379,
                            job_id="job", peers=peers)


@pytest.mark.parametrize("data", [list(range(10)), tuple(range(10)), np.arange(10), range(10)])
def test_shards_are_disjoint_complete_and_keep_their_type(data: object) -> None:
    parts = [sky.shard(data, node=n, total_nodes=3) for n in range(3)]
    flat = sorted(int(x) for part in parts for x in part)
    assert flat == list(range(10))
    assert list(parts[1]) == [1, 4, 7]  # modulo striding
    expected = list if isinstance(data, range) else type(data)
    assert all(isinstance(p, expected) for p in parts)


def test_aligned_shards_of_several_arrays() -> None:
    x, y = np.arange(12).reshape(6, 2), np.arange(6) * 10
    xs, ys = sky.shard(x, y, node=1, total_nodes=2)
    assert (xs[:, 0] // 2 * 10 == ys).all()


def test_shuffle_is_the_same_permutation_on_every_node() -> None:
    parts = [sky.shard(list(range(100)), shuffle=True, seed=7, node=n, total_nodes=4) for n in range(4)]
    assert sorted(x for p in parts for x in p) == list(range(100))
    assert parts[0] != list(range(0, 100, 4))


def test_drop_last_gives_equal_counts() -> None:
    sizes = {len(sky.shard(list(range(10)), drop_last=True, node=n, total_nodes=3)) for n in range(3)}
    assert sizes == {3}


def test_shard_uses_instance_info_and_checks_inputs() -> None:
    runtime.bind_instance(info(2, 4))
    try:
        assert sky.shard(list(range(8))) == [2, 6]
        assert sky.instance_info().global_worker_index == 2  # type: ignore[union-attr]
        assert not sky.is_head()
    finally:
        runtime._process_instance.clear()
    with pytest.raises(ValueError, match="equal length"):
        sky.shard([1, 2], [1], node=0, total_nodes=1)
    with pytest.raises(ValueError, match="outside"):
        sky.shard([1], node=3, total_nodes=2)


def test_instance_info_computed_fields() -> None:
    head, other = info(0, 2), info(1, 2)
    assert head.is_head and sky.is_head(head) and not other.is_head
    assert other.total_workers == 2 and other.hostname


def test_output_filters_apply_on_nodes_only(capsys: pytest.CaptureFixture[str]) -> None:
    @sky.stdout(only="head")
    def talk() -> None:
        print("hello")

    runtime.bind_instance(info(1, 2))
    try:
        talk()
    finally:
        runtime._process_instance.clear()
    assert capsys.readouterr().out == ""
    talk()  # outside a pool nothing is filtered
    assert capsys.readouterr().out == "hello\n"


def test_redirect_output_routes_both_streams() -> None:
    import sys

    seen: list[str] = []
    with sky.redirect_output(seen.append):
        print("out")
        print("err", file=sys.stderr)
    assert "".join(seen) == "out\nerr\n"


def test_time_helpers() -> None:
    assert (sky.time.minutes(2), sky.time.hours(1), sky.time.days(0.5)) == (120, 3600, 43200)


def test_silencing_one_task_never_mutes_the_task_beside_it() -> None:
    """Two tasks at once in one process (Worker(concurrency=2)): one silent, one whose output
    is collected; every line of the second arrives and none of the first."""
    collected: list[str] = []
    stop = threading.Event()

    @sky.silent
    def noisy() -> None:
        while not stop.is_set():
            print("from the silent task")
            time.sleep(0.001)

    def talker() -> None:
        with redirect_output(collected.append):
            for i in range(40):
                print(f"line {i}")
                time.sleep(0.002)

    silent_thread = threading.Thread(target=noisy)
    silent_thread.start()
    try:
        talking = threading.Thread(target=talker)
        talking.start()
        talking.join(30)
    finally:
        stop.set()
        silent_thread.join(30)
    lines = "".join(collected).splitlines()
    assert lines == [f"line {i}" for i in range(40)]


# ---- decoration-time checks of the output decorators (issue 29 item 8) ----------------------

@pytest.mark.parametrize("decorator", [sky.stdout, sky.stderr])
@pytest.mark.parametrize(("only", "problem"), [
    ("tail", "got the string 'tail'"),
    ("HEAD", "got the string 'HEAD'"),
    (0, "got int 0"),
    (lambda: True, "cannot be called with one argument"),
    (lambda info, extra: True, "cannot be called with one argument"),
])
def test_a_bad_only_is_refused_at_decoration(decorator: Any, only: object,
                                             problem: str) -> None:
    name = decorator.__name__
    with pytest.raises(sky.ConfigError) as caught:
        decorator(only=only)
    message = str(caught.value)
    assert f'@sky.{name}(only=...) takes "head" or a predicate on sky.InstanceInfo' in message
    assert problem in message


def test_output_decorators_misused_say_how_to_write_them() -> None:
    def task() -> None: ...

    factory = r"decorator factory: write @sky.stdout\(only=\"head\"\)"
    with pytest.raises(sky.ConfigError, match=factory):
        sky.stdout(task)  # type: ignore[call-arg]
    with pytest.raises(sky.ConfigError, match=r"takes only= by name"):
        sky.stderr("head")  # type: ignore[call-arg]
    with pytest.raises(sky.ConfigError, match="decorates a function or a @sky.function"):
        sky.stdout(only="head")("not a function")
    with pytest.raises(sky.ConfigError, match="decorates a function"):
        sky.silent(42)
    with pytest.raises(sky.ConfigError, match=r"sky.stdout needs only=: @sky.stdout\(only="):
        sky.stdout()


def test_silent_works_bare_and_called(capsys: pytest.CaptureFixture[str]) -> None:
    @sky.silent
    def bare() -> None:
        print("bare")

    @sky.silent()
    def called() -> None:
        print("called")

    runtime.bind_instance(info(0, 1))
    try:
        bare()
        called()
    finally:
        runtime._process_instance.clear()
    assert capsys.readouterr().out == ""


def test_output_filters_hold_while_an_async_task_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The filter covers the coroutine's whole run, whichever decorator is on top."""

    async def chat() -> str:
        print("before")
        await asyncio.sleep(0.01)
        print("after")
        return "done"

    under = sky.function(sky.stdout(only="head")(chat))
    over = sky.stdout(only="head")(sky.function(chat))
    runtime.bind_instance(info(1, 2))  # not the head: its stdout is dropped
    try:
        assert under.local() == "done" and over.local() == "done"
    finally:
        runtime._process_instance.clear()
    assert capsys.readouterr().out == ""
    assert under.local() == "done"  # outside a pool nothing is filtered
    assert capsys.readouterr().out == "before\nafter\n"
