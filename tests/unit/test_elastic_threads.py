"""ElasticThreads: as many threads as a burst needs (bounded), none once idle."""

from __future__ import annotations

import threading
import time

import pytest

from skyward_iac.orchestration.elastic import ElasticThreads


def _named(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


def _wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_a_burst_runs_in_parallel_up_to_the_bound_and_the_threads_end_when_idle() -> None:
    pool = ElasticThreads(4, name="burst-test", idle=0.3)
    release = threading.Event()
    running = threading.Semaphore(0)

    def work(n: int) -> int:
        running.release()
        release.wait(10)
        return n * 2

    futures = [pool.submit(work, n) for n in range(10)]
    for _ in range(4):
        assert running.acquire(timeout=10)
    assert not running.acquire(timeout=0.2)  # a fifth never ran alongside the four
    assert len(_named("burst-test")) == 4
    release.set()
    assert [f.result(timeout=10) for f in futures] == [n * 2 for n in range(10)]
    assert _wait_for(lambda: not _named("burst-test")), _named("burst-test")
    assert pool.threads == 0
    # A later burst starts threads again.
    assert pool.submit(lambda: "again").result(timeout=10) == "again"


def test_work_after_a_quiet_spell_is_not_lost_to_a_thread_that_is_ending() -> None:
    pool = ElasticThreads(2, name="race-test", idle=0.01)
    for round_ in range(200):  # submit right around each thread's idle timeout
        assert pool.submit(lambda r=round_: r).result(timeout=10) == round_
        time.sleep(0.01 if round_ % 2 else 0)


def test_errors_reach_the_future_and_shutdown_cancels_what_has_not_started() -> None:
    pool = ElasticThreads(1, name="shut-test", idle=5)
    gate = threading.Event()
    first = pool.submit(gate.wait, 10)
    failing = pool.submit(lambda: 1 / 0)
    later = pool.submit(lambda: "never")
    time.sleep(0.1)
    pool.shutdown(cancel_futures=True)
    gate.set()
    assert first.result(timeout=10) is True
    assert failing.cancelled() and later.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    assert _wait_for(lambda: not _named("shut-test"))
    with pytest.raises(ZeroDivisionError):
        ElasticThreads(1, name="err-test").submit(lambda: 1 / 0).result(timeout=10)
