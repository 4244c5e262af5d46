"""shard(), InstanceInfo and output control, without a pool."""

from __future__ import annotations

import threading
import time

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
