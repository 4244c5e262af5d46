"""A session nobody closed: its pools are torn down when the script ends, and when it is
garbage-collected first, a ResourceWarning says so. Fake pools stand in for ``Compute`` (the
real pools are in tests/chaos/test_forgotten_session.py); the exit itself is a real process."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

from skyward_iac.orchestration import at_exit
from skyward_iac.orchestration.compute import Session

ROOT = Path(__file__).resolve().parents[2]


class FakePool:
    """A ``Closeable`` that records how it was torn down."""

    def __init__(self, name: str, error: Exception | None = None, seconds: float = 0.0) -> None:
        self.stack_name = name
        self.error = error
        self.seconds = seconds
        self.how: str | None = None
        self.thread: str | None = None

    def teardown(self, how: str = "pool closed") -> None:
        self.how, self.thread = how, threading.current_thread().name
        time.sleep(self.seconds)
        if self.error is not None:
            raise self.error


class Owner:
    pass


@pytest.fixture(autouse=True)
def own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees only the lists it tracks (other tests' sessions stay registered)."""
    monkeypatch.setattr(at_exit, "_tracked", {})


def test_a_collected_owner_with_pools_warns_and_leaves_them_to_the_exit() -> None:
    owner, pools = Owner(), [FakePool("local-a")]
    at_exit.track(owner, pools)
    with pytest.warns(ResourceWarning, match=r"sky.Owner garbage-collected without close\(\); "
                                             r"its 1 pool\(s\) \(local-a\) are destroyed"):
        del owner  # no cycle: freed, and finalized, at once
    taken = at_exit.forgotten()
    assert [p.stack_name for p in taken] == ["local-a"]
    assert pools == [] and at_exit.forgotten() == []  # taken once


def test_a_collected_owner_without_pools_is_forgotten_quietly() -> None:
    owner: Owner | None = Owner()
    at_exit.track(owner, [])
    assert len(at_exit._tracked) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        owner = None
        gc.collect()
    assert at_exit._tracked == {}


def test_a_closed_session_leaves_nothing_for_the_exit() -> None:
    session = Session()
    session._computes.append(FakePool("local-b"))  # type: ignore[arg-type]
    assert [p.stack_name for p in at_exit.forgotten()] == ["local-b"]
    session._computes.append(FakePool("local-c"))  # type: ignore[arg-type]
    session.close()
    assert at_exit.forgotten() == []  # close emptied the very list the exit looks at
    session.close()


def test_close_forgotten_tears_down_every_pool_concurrently_and_never_raises(
        caplog: pytest.LogCaptureFixture) -> None:
    pools = [FakePool("local-slow", seconds=0.5), FakePool("local-broken", RuntimeError("boom")),
             FakePool("local-ok", seconds=0.5)]
    at_exit.track(Owner(), pools[:1])
    keep = Owner()
    at_exit.track(keep, pools[1:])
    with caplog.at_level(logging.WARNING, logger="skyward"):
        at_exit.close_forgotten()
    assert [p.how for p in pools] == [at_exit.HOW] * 3
    assert len({p.thread for p in pools}) == 3  # one thread each, side by side
    assert "3 pool(s) of a sky.Session that was never closed" in caplog.text
    assert "stack local-broken: destroying it at exit failed: boom" in caplog.text
    at_exit.close_forgotten()  # nothing left: no second teardown, no second warning
    assert caplog.text.count("never closed") == 1


def test_the_exit_hook_runs_before_non_daemon_threads_are_waited_for() -> None:
    """In a real interpreter exit: the pools go first, while thread pools still take work and
    logging still writes; a non-daemon thread still running is waited for afterwards."""
    script = textwrap.dedent("""
        import logging, sys, threading, time
        from concurrent.futures import ThreadPoolExecutor
        from skyward_iac.orchestration import at_exit

        logging.basicConfig(stream=sys.stdout, format="LOG %(message)s")

        class Pool:
            stack_name = "local-x"
            def teardown(self, how):
                with ThreadPoolExecutor(1) as threads:  # what a real teardown may use
                    threads.submit(print, "TORN DOWN", how, flush=True).result()

        class Session:
            pass

        def user_thread():
            time.sleep(1.5)
            print("USER THREAD ENDS", flush=True)

        KEPT = Session()
        at_exit.track(KEPT, [Pool()])
        threading.Thread(target=user_thread).start()
        print("MAIN ENDS", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "MAIN ENDS", lines
    assert lines[1].startswith("LOG 1 pool(s) of a sky.Session that was never closed"), lines
    assert lines[2] == f"TORN DOWN {at_exit.HOW}", lines
    assert lines[3] == "USER THREAD ENDS", lines
    assert "Traceback" not in done.stderr, done.stderr


def test_a_forked_child_that_exits_leaves_its_parents_pools_alone() -> None:
    script = textwrap.dedent("""
        import os, sys
        from skyward_iac.orchestration import at_exit

        class Pool:
            stack_name = "local-y"
            def teardown(self, how):
                print("TORN DOWN BY", "child" if os.getpid() != PARENT else "parent", flush=True)

        class Session:
            pass

        PARENT = os.getpid()
        KEPT = Session()
        at_exit.track(KEPT, [Pool()])
        child = os.fork()
        if child:
            os.waitpid(child, 0)
            print("CHILD DONE", flush=True)
        # both processes end here, normally: each runs its exit hooks
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["CHILD DONE", "TORN DOWN BY parent"], done.stdout


def test_a_ctrl_c_while_the_exit_destroys_are_set_up_is_noted_and_the_setup_finished() -> None:
    from skyward_iac.orchestration.at_exit import _through_ctrl_c

    calls = []

    def make() -> str:
        calls.append(1)
        if len(calls) < 3:  # a Ctrl+C lands inside it, twice
            raise KeyboardInterrupt
        return "made"

    assert _through_ctrl_c(make) == ("made", True)
    assert _through_ctrl_c(lambda: 7) == (7, False)
