"""A script a Ctrl+C ended exits by SIGINT (status -2, 130 from a shell), every time.

CPython ends a process by SIGINT itself when a ``KeyboardInterrupt`` leaves the main module,
after it has run the exit hooks and finalized the modules. Two things undo that while it shuts
down, and a pool's script meets both:

* a Ctrl+C that lands in an exit hook (``atexit``, the threading hooks that join thread pools
  or destroy a forgotten session's pools) is printed as "Exception ignored" and the process
  exits 0;
* the interpreter keeps "a KeyboardInterrupt ended the script" in one global flag, which every
  ``exec``/``eval`` of a string clears (a dataclass or namedtuple made by a module another
  thread imports late), and the process exits 1.

``install()`` (at a pool's start) chains ``sys.excepthook`` and ``sys.unraisablehook``: a
``KeyboardInterrupt`` that ends the script, or that an exit hook raised, is noted (``note()``
lets a hook that catches its own say so). Once every exit hook has run, a sentinel kept in
``builtins`` (whose dict the interpreter clears after the last exit hook) raises one more
``KeyboardInterrupt`` through ``exec`` of a string: the very path that sets that flag, so the
interpreter itself exits by SIGINT after its own finalization (files still flushed). A
``KeyboardInterrupt`` the script catches and survives changes nothing.
"""

from __future__ import annotations

import builtins
import sys
import threading
from types import TracebackType
from typing import Any

#: The name of the sentinel in ``builtins`` (private: nothing looks it up but this module).
SENTINEL = "_skyward_exit_by_sigint"


class ExitBySigint:
    """Kept in ``builtins`` only: finalized when the interpreter clears that dict, after every
    exit hook; then, when a Ctrl+C was noted, it sets the interpreter's own flag."""

    def __init__(self) -> None:
        self.interrupted = False
        # Bound now: module globals and builtins are being torn down when __del__ runs.
        self._namespace: dict[str, Any] = {"interrupt": KeyboardInterrupt, "__builtins__": {}}
        self._interrupt = KeyboardInterrupt

    def __del__(self) -> None:
        if not self.interrupted:
            return
        try:
            # A string, not a code object: only that path marks an unhandled Ctrl+C.
            exec("raise interrupt", self._namespace)  # noqa: S102 - a constant, see above
        except self._interrupt:
            pass


_lock = threading.Lock()


def _sentinel() -> ExitBySigint | None:
    found = builtins.__dict__.get(SENTINEL)
    return found if isinstance(found, ExitBySigint) else None


def note() -> None:
    """A Ctrl+C ended the script (for an exit hook that catches its own KeyboardInterrupt)."""
    sentinel = _sentinel()
    if sentinel is not None:
        sentinel.interrupted = True


def exiting() -> bool:
    """Whether the interpreter is running its exit hooks (the main thread is done)."""
    return not threading.main_thread().is_alive()


def interactive() -> bool:
    """Whether this is an interactive interpreter: a Ctrl+C there ends a statement, and the
    prompt comes back."""
    return bool(sys.flags.interactive) or hasattr(sys, "ps1")


def install() -> None:
    """Make a Ctrl+C that ends the script end the process by SIGINT (see the module doc);
    idempotent."""
    with _lock:
        if _sentinel() is not None:
            return
        builtins.__dict__[SENTINEL] = ExitBySigint()
        previous_except, previous_unraisable = sys.excepthook, sys.unraisablehook

        def excepthook(kind: type[BaseException], value: BaseException,
                       tb: TracebackType | None) -> None:
            if issubclass(kind, KeyboardInterrupt) and not interactive():
                note()
            previous_except(kind, value, tb)

        def unraisablehook(unraisable: Any) -> None:
            if issubclass(unraisable.exc_type, KeyboardInterrupt) and exiting():
                note()
            previous_unraisable(unraisable)

        sys.excepthook = excepthook
        sys.unraisablehook = unraisablehook
