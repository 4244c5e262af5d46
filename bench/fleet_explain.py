"""Instruments for finding out why a figure 7 number grows: ``bench/fleet.py --explain``.

Not part of the figure itself (they cost time of their own): Python memory allocated while
the nodes connect, by source file (``tracemalloc``), and the CPU the dispatcher spends placing
calls (``Dispatcher._place``, timed on the calling thread's CPU clock). ``--poll SECONDS``
changes one thing in the client for an experiment: how often each paramiko transport's thread
wakes up to look for a closed socket or a due keepalive (paramiko's
``Transport._active_check_timeout``, 0.1 s).
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def memory_by_file(into: dict[str, Any], per: int, top: int = 12) -> Iterator[None]:
    """Python memory still allocated after the block, by source file, in KiB per ``per``
    (per node), the ``top`` files kept."""
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    yield
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown: dict[str, float] = {}
    for stat in after.compare_to(before, "filename"):
        name = _short(stat.traceback[0].filename)
        grown[name] = grown.get(name, 0.0) + stat.size_diff / 1024 / per
    kept = sorted(grown.items(), key=lambda item: -item[1])[:top]
    into["python KiB per node by file"] = {name: round(kib, 1) for name, kib in kept}
    into["python KiB per node"] = round(sum(grown.values()), 1)


def _short(filename: str) -> str:
    """``paramiko/transport.py`` for a site-packages path, the last two parts otherwise."""
    parts = Path(filename).parts
    return "/".join(parts[-2:])


@contextmanager
def timed_method(into: dict[str, Any], owner: type, name: str) -> Iterator[None]:
    """Count the calls of ``owner.name`` in the block and the CPU seconds they took (on their
    own thread's clock)."""
    original = getattr(owner, name)
    spent = {"calls": 0, "cpu": 0.0}

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent["cpu"] += time.thread_time() - started
            spent["calls"] += 1

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, original)
        into[f"{owner.__name__}.{name}"] = {"calls": spent["calls"],
                                            "CPU s": round(spent["cpu"], 3)}


def set_poll(seconds: float) -> None:
    """How often each paramiko transport's thread wakes up when nothing arrives."""
    import paramiko

    paramiko.Transport._active_check_timeout = seconds
