"""The suite's check for pools that outlive their test file (tests/pool_threads.py)."""

from __future__ import annotations

import threading

from tests import pool_threads
from tests.scheduling import SHARED_POOLS


def test_a_file_ends_when_another_file_or_nothing_runs_next() -> None:
    a, b = "tests/unit/test_a.py", "tests/integration/test_b.py"
    assert not pool_threads.file_ends(a, a)
    assert pool_threads.file_ends(a, b) and pool_threads.file_ends(a, None)
    first, second = sorted(SHARED_POOLS)[:2]  # the shared pools' files are one
    assert not pool_threads.file_ends(first, second)
    assert pool_threads.file_ends(second, a)


def test_only_live_unreported_heartbeat_threads_are_left_open() -> None:
    stop = threading.Event()
    beating = threading.Thread(target=stop.wait, name=pool_threads.POOL_THREAD, daemon=True)
    other = threading.Thread(target=stop.wait, name="skyward-beat", daemon=True)
    beating.start()
    other.start()
    try:
        assert pool_threads.left_open([beating, other], set()) == [beating]
        assert pool_threads.left_open([beating, other], {beating.ident or 0}) == []
    finally:
        stop.set()
        beating.join()
    assert pool_threads.left_open([beating], set()) == []  # ended: the pool closed
