"""Pools a ``sky.Session`` still holds when the script ends are destroyed before it exits.

A session registers the list of its pools here; ``close()`` empties that list. When the main
thread's code is done (it returned, raised or called ``sys.exit``), whatever is still listed
is destroyed, so a forgotten session leaves nothing running; before, its nodes ran until their
ttl (600 s by default).

The moment is ``threading``'s own exit hook, which runs before the interpreter waits for
non-daemon threads and before ``concurrent.futures`` stops taking work. A plain ``atexit``
handler would run too late (the pool's heartbeat and node starts run on thread pools, which
take no work by then) and not at all while a non-daemon thread keeps the process alive. So a
thread still using a forgotten session's pool after the main thread ended sees its calls fail
with ``NodeConnectionError``, as it would see ``concurrent.futures`` refuse new work. Logging
still works then (it shuts down later, in ``atexit``).

In a Jupyter kernel nothing is done here: the kernel's reaper destroys its pools once the
kernel has ended (``notebook.py``), whether it ended well or not.

A forked child (``os.fork``) forgets the parent's sessions: only their owner destroys them.

A session garbage-collected with pools in it warns (``ResourceWarning``, as an unclosed file
does). Its pools may still be in use through their ``Pool`` objects, so they are destroyed at
the exit too, not at once.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from skyward_iac.observability.console import in_jupyter_kernel
from skyward_iac.orchestration import interrupts

T = TypeVar("T")

log = logging.getLogger("skyward")

#: How a forgotten pool's run ends in its stack's history (``skyward: <HOW>``).
HOW = "session never closed: destroyed at interpreter exit"


class Closeable(Protocol):
    """What a session holds per pool (a ``Compute``)."""

    @property
    def stack_name(self) -> str: ...

    def teardown(self, how: str = ...) -> None: ...


#: Every tracked session's list of pools, by the list's id (the list is kept alive here).
_tracked: dict[int, list[Any]] = {}
_lock = threading.Lock()
_hooked = False


def track(owner: object, pools: list[Any]) -> None:
    """Destroy whatever ``pools`` (a list of ``Closeable`` that ``owner`` adds to and empties)
    holds when the script ends; warn if ``owner`` is garbage-collected with pools in it."""
    _hook_once()
    with _lock:
        _tracked[id(pools)] = pools
    finalizer = weakref.finalize(owner, _collected, pools, type(owner).__name__)
    finalizer.atexit = False  # at the exit, close_forgotten does the work, without a warning


def _collected(pools: list[Closeable], kind: str) -> None:
    """The owner was garbage-collected: forget an empty list, warn about a full one."""
    if not pools:
        with _lock:
            _tracked.pop(id(pools), None)
        return
    names = ", ".join(p.stack_name for p in list(pools))
    warnings.warn(f"sky.{kind} garbage-collected without close(); its {len(pools)} pool(s) "
                  f"({names}) are destroyed when the interpreter exits. Use "
                  f"`with sky.{kind}() as session:` or call session.close().", ResourceWarning,
                  stacklevel=1)


def forgotten() -> list[Closeable]:
    """Take every pool still held by a session nobody closed (their lists are emptied)."""
    with _lock:
        lists = list(_tracked.values())
    taken: list[Closeable] = []
    for pools in lists:
        taken += pools
        pools.clear()
    return taken


def close_forgotten() -> None:
    """Destroy the pools of sessions nobody closed, concurrently; never raises (it runs at
    exit: an error is logged). A Ctrl+C meanwhile is noted (the script then exits by SIGINT)
    and the destroys are still waited for; a second one leaves them to ``skyward-iac gc``."""
    if in_jupyter_kernel():
        # The kernel's reaper destroys them once the kernel is gone (orchestration/notebook.py):
        # a frontend kills a kernel a few seconds into its shutdown, too soon for a destroy.
        return
    pools = forgotten()
    if not pools:
        return
    names = ", ".join(p.stack_name for p in pools)
    # Plain non-daemon threads: thread pools may take no work here (the atexit fallback), and
    # the interpreter waits for these even when a Ctrl+C ends the wait below. Every one starts,
    # whatever Ctrl+C comes meanwhile: it is handled in the wait.
    interrupted = False
    try:
        log.warning("%d pool(s) of a sky.Session that was never closed: destroying %s before "
                    "the interpreter exits (use `with sky.Session() as session:` or "
                    "session.close())", len(pools), names)
    except KeyboardInterrupt:
        interrupted = True
    done, hit = _through_ctrl_c(lambda: [threading.Event() for _ in pools])
    interrupted = interrupted or hit
    for pool, finished in zip(pools, done, strict=True):
        thread, hit = _through_ctrl_c(lambda pool=pool, finished=finished: threading.Thread(
            target=_teardown, args=(pool, finished), name=f"skyward-exit-{pool.stack_name}"))
        interrupted = _start(thread) or hit or interrupted
    if not interrupted:
        try:
            _wait(done)
            return
        except KeyboardInterrupt:
            pass
    # The destroys need the thread pools, which stop taking work once this hook returns: wait
    # here for them; only a second Ctrl+C leaves them to gc.
    interrupts.note()
    log.error("interrupted: still destroying %s (Ctrl+C again leaves it to `skyward-iac gc`)",
              names)
    try:
        _wait(done)
    except KeyboardInterrupt:
        log.error("interrupted again: %s left to `skyward-iac gc`", names)


def _through_ctrl_c(make: Callable[[], T]) -> tuple[T, bool]:
    """``make()``, made again if a Ctrl+C cut it short (it has no effect until used); and
    whether one came. The destroys must be set up whatever Ctrl+C lands while they are."""
    interrupted = False
    while True:
        try:
            return make(), interrupted
        except KeyboardInterrupt:
            interrupted = True


def _start(thread: threading.Thread) -> bool:
    """Start ``thread`` even through a Ctrl+C; whether one came. ``Thread.start`` launches the
    thread, then waits for it to run: a Ctrl+C in that wait leaves it launched (it then sets
    its ``_started`` itself), one before the launch leaves it to start again."""
    interrupted = False
    while True:
        try:
            if not thread._started.is_set():  # type: ignore[attr-defined]
                thread.start()
            return interrupted
        except KeyboardInterrupt:
            interrupted = True
            with contextlib.suppress(KeyboardInterrupt):
                thread._started.wait(1.0)  # type: ignore[attr-defined]


def _wait(done: list[threading.Event]) -> None:
    # Events, not Thread.join: on Python 3.11 a join that a Ctrl+C interrupts marks the thread
    # stopped (it releases the running thread's own state lock), so a second join returns at
    # once and the interpreter no longer waits for it: the destroy was cut off at exit.
    for finished in done:
        finished.wait()


def _teardown(pool: Closeable, finished: threading.Event) -> None:
    try:
        pool.teardown(HOW)
    except Exception as exc:  # noqa: BLE001 - nothing may escape an exit hook
        log.error("stack %s: destroying it at exit failed: %s", pool.stack_name, exc)
    finally:
        finished.set()


def _forget_in_child() -> None:
    """A forked child does not own its parent's pools: its exit must not destroy them."""
    global _lock
    _lock = threading.Lock()  # a parent thread may have held it at the fork
    _tracked.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _hook_once() -> None:
    global _hooked
    with _lock:
        if _hooked:
            return
        _hooked = True
    # CPython's "before non-daemon threads are joined" hook, the one concurrent.futures uses;
    # hooks run last-registered first, so this one runs while thread pools still take work.
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("this Python has no threading exit hook")
        register(close_forgotten)
    except RuntimeError:  # another Python, or the interpreter is shutting down already
        atexit.register(close_forgotten)
