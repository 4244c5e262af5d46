"""After each test file, a warning for every pool of this pytest process still open: its
heartbeat thread (``skyward-heartbeat``, one per open pool with a ttl) outlived the file.

A pool left open beats, streams its nodes' metrics and prints them into whatever test runs
next in the same worker, until the worker ends (a session-scoped pool did: test_pass_through
counted its beats). A warning, not a failure: it names the file that left the pool in the
run's warnings summary. The shared pools of tests/integration/conftest.py stay open between
the files that use them (``SHARED_POOLS``), and are checked when the last of those ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterable

import pytest

from tests.scheduling import SHARED_POOLS

#: The thread each open pool with a ttl runs (orchestration/heartbeat.py).
POOL_THREAD = "skyward-heartbeat"
#: How long a pool closed by the file's last teardown may take to stop its heartbeat.
GRACE = 10.0

#: Heartbeat threads already reported (each is warned about once).
_reported: set[int] = set()


class PoolLeftOpen(pytest.PytestWarning):
    """A pool outlived the test file that opened it."""


def path_of(item: pytest.Item | None) -> str | None:
    return None if item is None else item.nodeid.split("::", 1)[0]


def file_ends(path: str | None, next_path: str | None) -> bool:
    """Whether the test file ``path`` is done when ``next_path`` runs next (None: nothing
    does); the shared pools' files count as one."""
    if next_path == path:
        return False
    return not (path in SHARED_POOLS and next_path in SHARED_POOLS)


def left_open(threads: Iterable[threading.Thread], reported: set[int]) -> list[threading.Thread]:
    """The live pool threads among ``threads`` not reported yet."""
    return [t for t in threads if t.name == POOL_THREAD and t.is_alive()
            and t.ident not in reported]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item,
                            nextitem: pytest.Item | None) -> Generator[None, object, object]:
    result = yield  # the file's fixtures (module-scoped pools among them) are torn down here
    if file_ends(path_of(item), path_of(nextitem)):
        deadline = time.monotonic() + GRACE
        while (left := left_open(threading.enumerate(), _reported)) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        if left:
            _reported.update(t.ident for t in left if t.ident is not None)
            item.warn(PoolLeftOpen(f"{len(left)} pool(s) still open after the last test of "
                                   f"{path_of(item)}: a pool outlived the tests that made it"))
    return result
