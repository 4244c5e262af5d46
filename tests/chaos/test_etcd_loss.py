"""Losing the head's etcd, or the client's tunnel to it, on a real Local pool.

etcd is killed through the head's sandbox (its pid file), the SSH connection by killing the
head's sshd session process, a tunnelled connection alone with ``ss -K``. The user is told at
once (``sky.CollectionsLost``, a console line), collection calls fail fast with a
``CollectionError``, and the ``with`` block that ends normally ends without an exception.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.infra.stacks.home import local_nodes_dir
from skyward_iac.processes import sandbox_processes
from tests.agent_process import wait_until
from tests.chaos.test_pool_faults import assert_nothing_left

pytestmark = pytest.mark.chaos


def lost(seen: list[sky.Event]) -> list[sky.CollectionsLost]:
    return [e for e in seen if isinstance(e, sky.CollectionsLost)]


def head_sandbox(pool: sky.Pool) -> Path:
    return local_nodes_dir() / pool.stack_name / "node-0"


def etcd_pid(pool: sky.Pool) -> int:
    """The head's etcd, as its launcher recorded it in the sandbox."""
    return int(next(head_sandbox(pool).rglob("etcd.pid")).read_text())


def ssh_sessions(pool: sky.Pool) -> list[int]:
    """The head's sshd processes serving a connection (the client holds one per node)."""
    return [pid for pid in sandbox_processes(head_sandbox(pool))
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sshd: root@notty")]


def kill_tunnelled_connections(pool: sky.Pool) -> int:
    """Abort the head sshd's TCP connections to etcd (what carries the client's tunnel), as a
    network fault would; etcd and the SSH connection live on. How many were killed."""
    target = f"{pool.nodes[0].address.private_address}:2379"
    listed = subprocess.run(["ss", "-tnpH", "state", "established", "dst", target],
                            capture_output=True, text=True, check=True).stdout
    ports = [m.group(1) for line in listed.splitlines() if '"sshd"' in line
             if (m := re.search(r":(\d+)\s+\S+:2379", line))]
    for port in ports:
        subprocess.run(["ss", "-K", "state", "established", "dst", target, "sport", "=", port],
                       capture_output=True, check=True)
    return len(ports)


def failing_fast(call: object) -> float:
    """Seconds ``call()`` took to raise ``CollectionError``."""
    started = time.monotonic()
    with pytest.raises(sky.CollectionError):
        call()  # type: ignore[operator]
    return time.monotonic() - started


def test_etcd_killed_the_user_is_told_calls_fail_fast_and_the_block_exits_cleanly(
        capfd: pytest.CaptureFixture[str]) -> None:
    seen: list[sky.Event] = []
    with sky.Compute(provider=sky.Local(), nodes=1, on_event=seen.append,
                     options=sky.Options(console="log")) as pool:
        counter = pool.counter("c", consistency="strong")
        assert counter.increment() == 1
        os.kill(etcd_pid(pool), signal.SIGKILL)
        assert wait_until(lambda: lost(seen), 30), "nobody noticed etcd was gone"
        # Calls fail at once (before: each waited out its 10 s gRPC timeout).
        assert failing_fast(counter.increment) < 5
        with pytest.raises(sky.CollectionError, match=r"collections are lost: etcd on the head "
                                                      r"node stopped.*with its data, is gone"):
            pool.dict("new")
        assert failing_fast(lambda: sky.dict("seen-by-tasks")) < 5
        name = pool.stack_name
    # The block ended without an exception (before: invoke's ThreadException from the tunnel).
    [event] = lost(seen)
    assert event.stack == name and event.node == 0 and not event.fatal
    assert isinstance(event, sky.Error)  # every console shows it
    console = capfd.readouterr().err
    assert console.count("ERROR node 0: the distributed collections are lost") == 1, console
    assert_nothing_left(name)


def test_the_heads_ssh_connection_lost_takes_the_tunnel_and_a_new_head_starts_empty() -> None:
    seen: list[sky.Event] = []
    with sky.Compute(provider=sky.Local(), nodes=1, on_event=seen.append,
                     options=sky.Options(console=False)) as pool:
        pool.dict("d", consistency="strong")["a"] = 1
        [session] = ssh_sessions(pool)
        os.kill(session, signal.SIGKILL)
        assert wait_until(lambda: lost(seen), 30), "nobody noticed the tunnel was gone"
        assert "collections are lost" in lost(seen)[0].message
        assert wait_until(lambda: any(isinstance(e, sky.InstanceReplaced) for e in seen), 120)
        fresh = pool.dict("d", consistency="strong")  # through the new head's etcd
        assert fresh.get("a") is None
        fresh["b"] = 2
        assert fresh["b"] == 2
        name = pool.stack_name
    assert len(lost(seen)) == 1  # the old head's etcd, once
    assert_nothing_left(name)


def test_a_broken_tunnelled_connection_is_opened_again_while_etcd_lives() -> None:
    seen: list[sky.Event] = []
    with sky.Compute(provider=sky.Local(), nodes=1, on_event=seen.append,
                     options=sky.Options(console=False)) as pool:
        counter = pool.counter("c", consistency="strong")
        assert counter.increment() == 1
        assert kill_tunnelled_connections(pool) >= 1

        def value() -> int | None:
            try:
                return counter.value
            except sky.CollectionError:
                return None  # a call that raced the break; gRPC connects again

        assert wait_until(lambda: value() == 1, 20), "the tunnel was not opened again"
        assert counter.increment() == 2  # nothing lost
        time.sleep(1)  # a false alarm would come from the check of the closed connection
        name = pool.stack_name
    assert lost(seen) == []
    assert_nothing_left(name)
