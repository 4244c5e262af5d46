"""Whole lines on the process's stdout and stderr, which the user's prints share with the console.

The console, the echo of warnings and the relayed output of remote tasks write whole lines; the
user's code writes what it likes, and ``print("x")`` itself is two writes (``"x"``, then
``"\\n"``). Run as ``python -u app.py > run.log 2>&1``, both streams are one file, and a line
of ours written between those two writes split the user's line (``completed: slow19:41:46
tasks: ...``), about once in 20 runs.

So every write to the process's streams goes through here:

* ``track_streams()`` wraps ``sys.stdout`` and ``sys.stderr`` in ``TrackedStream``s, which
  note, per file they reach (a terminal, a pipe, a log file: stdout and stderr are one file when
  they share one), whether the user's last write ended its line;
* ``write_lines(stream, text)`` writes our lines only at a line boundary of that file: at once
  when the user's line is closed (after flushing the user's buffered text, so the order holds
  without ``-u`` too), otherwise as soon as the user's next write ends the line. A line left
  open longer than ``GRACE`` seconds (a progress bar, ``print(..., end="")`` and a long wait)
  is ended with a newline so our lines are not held back: they still start on a line of their
  own. What is held at exit is written then.

Writes that bypass ``sys.stdout``/``sys.stderr`` (``os.write(1, ...)``, a subprocess sharing the
file) are not seen. Nothing is wrapped in a Jupyter kernel, whose frontend keeps each stream's
output apart already.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import sys
import threading
import time
import weakref
from collections.abc import Hashable, Iterable
from typing import Any, TextIO

#: How long a user's open line holds our lines back before it is ended for them (seconds).
#: ``print`` ends its line microseconds after opening it; a line open this long is a progress
#: bar or a prompt, not a line being written.
GRACE = 2.0


class SharedFile:
    """What the streams writing to one file know of it: whether its last line is open, and our
    lines waiting for it to close. One lock orders every write to the file."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        #: Whether the user's last write left a line open.
        self.line_open = False
        #: Our lines waiting for the line to close: (stream to write them to, text).
        self.pending: list[tuple[Any, str]] = []
        #: When the first of ``pending`` began to wait (monotonic).
        self.waiting_since: float | None = None
        self.streams: weakref.WeakSet[TrackedStream] = weakref.WeakSet()

    def wrote(self, text: str) -> None:
        """The user's code wrote ``text`` (with ``lock`` held)."""
        if not text:
            return
        self.line_open = not text.endswith("\n")
        if not self.line_open and self.pending:
            self.drain()

    def flush_streams(self) -> None:
        """Push the user's buffered text to the file, so ours lands after it (``lock`` held)."""
        for stream in list(self.streams):
            with contextlib.suppress(OSError, ValueError):
                stream.inner.flush()

    def write(self, stream: Any, text: str) -> None:
        """Write our ``text`` (whole lines) now, after the user's buffered text (``lock`` held)."""
        self.flush_streams()
        _write(stream, text)

    def defer(self, stream: Any, text: str) -> None:
        """Hold our ``text`` until the user's line ends, or ``GRACE`` seconds (``lock`` held)."""
        self.pending.append((stream, text))
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()
            self._end_open_line_in(GRACE)

    def _end_open_line_in(self, delay: float) -> None:
        timer = threading.Timer(delay, self._end_open_line)
        timer.daemon = True
        timer.start()

    def _end_open_line(self) -> None:
        with self.lock:
            if self.waiting_since is None:
                return  # the line ended in time
            waited = time.monotonic() - self.waiting_since
            if waited < GRACE:
                return  # the line ended in time; lines waiting since have a timer of their own
            self.drain(end_open_line=True)

    def drain(self, end_open_line: bool = False) -> None:
        """Write our waiting lines (``lock`` held); ``end_open_line``: end the user's open line
        first (it was open too long, or the process exits)."""
        if not self.pending:
            return
        if self.line_open:
            if not end_open_line:
                return
            self.flush_streams()
            _write(self.pending[0][0], "\n")
            self.line_open = False
        pending, self.pending, self.waiting_since = self.pending, [], None
        self.flush_streams()
        for stream, text in pending:
            _write(stream, text)


class TrackedStream:
    """``sys.stdout`` or ``sys.stderr``: writes through to the stream it wraps, noting on the
    way whether they left a line open. Everything else is the wrapped stream's."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self.shared = _shared_file(inner)
        self.shared.streams.add(self)

    def write(self, text: str) -> int:
        with self.shared.lock:
            written = self.inner.write(text)
            self.shared.wrote(text)
        return written

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.inner.flush()

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.inner, attribute)


#: The files some ``TrackedStream`` writes to, by identity; an entry lives as long as one does.
_files: weakref.WeakValueDictionary[Hashable, SharedFile] = weakref.WeakValueDictionary()
_files_lock = threading.Lock()


def _identity(stream: Any) -> Hashable:
    """Which file ``stream`` writes to: the device and inode behind its descriptor (stdout and
    stderr redirected to one file, or one terminal, are the same), else the object itself."""
    try:
        info = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return ("object", id(stream))
    return ("file", info.st_dev, info.st_ino)


def _shared_file(stream: Any) -> SharedFile:
    key = _identity(stream)
    with _files_lock:
        shared = _files.get(key)
        if shared is None:
            shared = SharedFile()
            _files[key] = shared
        return shared


def raw(stream: Any) -> Any:
    """The stream under a ``TrackedStream`` (itself for any other)."""
    return stream.inner if isinstance(stream, TrackedStream) else stream


def _write(stream: Any, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        pass  # a closed pipe must not break the pool


def track_streams() -> None:
    """Put ``TrackedStream``s in front of ``sys.stdout`` and ``sys.stderr`` (once; a stream
    replaced since is wrapped again), beneath output control's ``RoutedStream`` when it is
    there, so a task's routed output is not taken for what reaches the file."""
    from skyward_iac.api.runtime import RoutedStream
    from skyward_iac.observability.console import in_jupyter_kernel

    if in_jupyter_kernel():
        return
    for name in ("stdout", "stderr"):
        current = getattr(sys, name)
        if current is None:
            continue
        if isinstance(current, RoutedStream):
            if not isinstance(current.inner, TrackedStream):
                current.inner = TrackedStream(current.inner)
        elif not isinstance(current, TrackedStream):
            setattr(sys, name, TrackedStream(current))


def write_lines(stream: Any, text: str) -> None:
    """Write ``text`` (whole lines; a last newline is added when missing) to ``stream`` where
    no user's line is open in the file it reaches (see the module doc)."""
    if not text.endswith("\n"):
        text += "\n"
    if isinstance(stream, TrackedStream):
        shared: SharedFile | None = stream.shared
    else:
        with _files_lock:
            shared = _files.get(_identity(stream))
    target = raw(stream)
    if shared is None:  # nothing of the user's is tracked there: every line is closed
        _write(target, text)
        return
    with shared.lock:
        if not shared.line_open and not shared.pending:
            shared.write(target, text)
        else:
            shared.defer(target, text)


def end_open_line(stream: Any) -> None:
    """End the user's open line in the file ``stream`` reaches, if one is: something that
    is not a line (a live view) is about to be drawn there."""
    with _files_lock:
        shared = _files.get(_identity(raw(stream)))
    if shared is not None:
        with shared.lock:
            if shared.line_open:
                shared.flush_streams()
                _write(raw(stream), "\n")
                shared.line_open = False


def flush_waiting() -> None:
    """Write every line still waiting for a user's line to end (ending it): the console's
    last lines must not be lost at exit."""
    with _files_lock:
        files = list(_files.values())
    for shared in files:
        with shared.lock:
            shared.drain(end_open_line=True)


atexit.register(flush_waiting)
