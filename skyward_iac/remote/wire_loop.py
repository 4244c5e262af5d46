"""One thread that reads every node connection of the client and fires every task deadline.

A pool used to hold two threads per node (a reader blocked in ``recv`` and a deadline sleeper);
now the process holds one ``WireLoop`` whatever the number of nodes and pools: one epoll
(``readiness``) over every connection, and a heap of timers. It is process-wide rather than per pool
because nothing in it belongs to a pool (the connections of several pools, a health probe's
client, are served alike) and a process then has one such thread, not one per pool.

Rules that keep one slow node from stalling the others:

- reads never block (remote/wire_streams.py) and frames are decoded as bytes arrive
  (node/frame_decoder.py): a node that sends half a frame and stops only holds its own decoder;
- a connection gets at most ``READS_PER_TURN`` reads before the others are served: a huge frame
  arriving fast is read in turns with everyone else's results;
- what the loop calls (``on_frames``, ``on_end``, timers) only does bookkeeping; anything that
  may wait is handed to a ``callback_lanes.Lane`` by the caller (remote/agent_client.py).

The thread is a daemon (it never keeps a process alive) and is started by the first
connection; a forked child starts its own.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import select
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from skyward_iac.node import protocol
from skyward_iac.node.frame_decoder import SCRATCH, Frame, FrameDecoder
from skyward_iac.remote.callback_lanes import Lane, PerProcess
from skyward_iac.remote.wire_streams import WireStream

log = logging.getLogger(__name__)

#: Reads of one connection before the others get theirs (each at most 1 MiB).
READS_PER_TURN = 4
_READ = getattr(select, "EPOLLIN", 1)
#: Seconds ``close`` waits for the loop to let go of a connection before closing it anyway.
_DETACH_WAIT = 5.0


@dataclass(eq=False)
class Reading:
    """A connection the loop serves: its stream, its decoder and whom it tells."""

    stream: WireStream
    on_frames: Callable[[list[Frame]], Any]
    #: Called once with why the connection ended (``protocol.ConnectionClosed``, an
    #: ``OSError`` or a ``protocol.ProtocolError``), after the loop let go of it.
    on_end: Callable[[BaseException], Any]
    #: Set by the loop when it registers the connection (its decoders share one scratch).
    decoder: FrameDecoder | None = None
    #: The file descriptor it is watched by (kept: the stream may be closed under the loop).
    fd: int = -1


class Timer:
    """A call the loop makes at a monotonic time, unless cancelled first."""

    __slots__ = ("call", "cancelled")

    def __init__(self, call: Callable[[], Any]) -> None:
        self.call, self.cancelled = call, False

    def cancel(self) -> None:
        self.cancelled = True


def readiness() -> Any:
    """What the loop waits on: ``select.epoll`` itself on Linux (the ``selectors`` layer over
    it cost 0.7 us a turn here, a round trip's wake-up), elsewhere (macOS) the ``selectors``
    module's best, called as an epoll is."""
    epoll = getattr(select, "epoll", None)
    return epoll() if epoll is not None else SelectorPoll()


class SelectorPoll:
    """``select.epoll``'s calls, as the loop makes them, over ``selectors.DefaultSelector``."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()

    def register(self, fd: int, _events: int) -> None:
        self._selector.register(fd, selectors.EVENT_READ)

    def unregister(self, fd: int) -> None:
        self._selector.unregister(fd)

    def poll(self, timeout: float | None) -> list[tuple[int, int]]:
        return [(key.fd, events) for key, events in self._selector.select(timeout)]


class WireLoop:
    """The selector thread (see the module doc). Every method may be called from any thread."""

    def __init__(self) -> None:
        self._ready = readiness()
        #: What each watched file descriptor is: a connection, or None for the wake-up socket.
        self._watched: dict[int, Reading | None] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._ready.register(self._wake_r.fileno(), _READ)
        self._watched[self._wake_r.fileno()] = None
        self._lock = threading.Lock()
        self._calls: deque[Callable[[], Any]] = deque()
        self._timers: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._woken = False
        self._again: set[Reading] = set()
        self._readings: dict[WireStream, Reading] = {}
        self._scratch = bytearray(SCRATCH)
        self.thread = threading.Thread(target=self._run, name="skyward-wire", daemon=True)
        self.thread.start()

    # ---- what callers ask ---------------------------------------------------------------------

    def register(self, reading: Reading) -> None:
        """Serve ``reading`` from now on (its stream is read at once: bytes may wait already)."""
        self.call_soon(lambda: self._register(reading))

    def detach(self, stream: WireStream) -> None:
        """Stop serving ``stream`` and close it; returns once closed (the selector must let go
        of a file descriptor before it is closed and perhaps reused)."""
        if threading.current_thread() is self.thread:
            self._detach(stream)
            return
        done = threading.Event()

        def detach() -> None:
            try:
                self._detach(stream)
            finally:
                done.set()

        self.call_soon(detach)
        if not done.wait(_DETACH_WAIT):
            log.warning("the wire loop did not let go of a connection in %gs", _DETACH_WAIT)
            stream.close()

    def call_at(self, when: float, call: Callable[[], Any]) -> Timer:
        """Call ``call()`` on the loop at monotonic time ``when``."""
        timer = Timer(call)
        with self._lock:
            earliest = self._timers[0][0] if self._timers else None
            heapq.heappush(self._timers, (when, next(self._order), timer))
            wake = earliest is None or when < earliest
        if wake:
            self._wake()
        return timer

    def call_soon(self, call: Callable[[], Any]) -> None:
        with self._lock:
            self._calls.append(call)
        self._wake()

    # ---- the loop -----------------------------------------------------------------------------

    def _wake(self) -> None:
        if threading.current_thread() is self.thread:
            return  # it looks at its calls and timers before it waits again
        with self._lock:
            if self._woken:
                return
            self._woken = True
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:
            pass  # already full of wake-ups

    def _run(self) -> None:
        while True:
            try:
                self._turn()
            except Exception:  # the loop serves everyone: it must not die
                log.exception("wire loop")

    def _turn(self) -> None:
        # The round trip's path: every line here is paid once per result, so the common case
        # (one connection readable, no calls, no timer due) takes no lock and builds nothing.
        # Timers and calls are read without the lock: one added meanwhile wakes the selector.
        if self._calls:
            with self._lock:
                calls, self._calls = self._calls, deque()
            for call in calls:
                self._safely(call)
        timers = self._timers
        if self._again or self._calls:
            timeout: float | None = 0.0
        else:
            timeout = max(0.0, timers[0][0] - time.monotonic()) if timers else None
        events = self._ready.poll(timeout)
        again, self._again, watched = self._again, set(), self._watched
        for fd, _ in events:
            reading = watched[fd]
            if reading is None:
                self._drain_wakeups()
            elif reading not in again and reading.stream in self._readings:
                self._serve(reading)
        for reading in again:
            if reading.stream in self._readings:
                self._serve(reading)
        if timers and timers[0][0] <= time.monotonic():
            self._fire_timers()

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        # Only now: a wake-up sent while draining would be lost with the bytes drained. A call
        # posted before this is run by the next turn, which starts with the calls.
        with self._lock:
            self._woken = False

    def _fire_timers(self) -> None:
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._timers or self._timers[0][0] > now:
                    return
                _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self._safely(timer.call)

    def _register(self, reading: Reading) -> None:
        try:
            reading.fd = reading.stream.fileno()
            self._ready.register(reading.fd, _READ)
        except (OSError, ValueError, KeyError) as exc:
            self._safely(partial(reading.on_end, OSError(f"cannot watch the connection: {exc}")))
            return
        reading.decoder = FrameDecoder(self._scratch)
        self._watched[reading.fd] = reading
        self._readings[reading.stream] = reading
        self._again.add(reading)

    def _detach(self, stream: WireStream) -> None:
        self._unregister(stream)
        if stream.close_may_wait:
            Lane().run(stream.close)  # an SSH channel's close message may wait on its transport
            return
        try:
            stream.close()
        except OSError:
            pass

    def _unregister(self, stream: WireStream) -> Reading | None:
        reading = self._readings.pop(stream, None)
        if reading is not None:
            self._again.discard(reading)
            # The fd may have been closed under us, and be another connection's by now: the
            # kernel dropped the old registration with its close.
            if self._watched.get(reading.fd) is reading:
                del self._watched[reading.fd]
                try:
                    self._ready.unregister(reading.fd)
                except (OSError, ValueError, KeyError):
                    pass  # closed under us
        return reading

    def _serve(self, reading: Reading) -> None:
        """Read what ``reading`` has (a few reads at most), hand over the frames completed."""
        stream, decoder = reading.stream, reading.decoder
        assert decoder is not None
        try:
            for _ in range(READS_PER_TURN):
                view = decoder.buffer()
                room = len(view)
                count = stream.recv_into(view)
                if count is None:
                    decoder.filled(0)
                    break
                if count == 0:
                    decoder.filled(0)
                    end = "in the middle of a frame" if decoder.mid_frame else "by peer"
                    raise protocol.ConnectionClosed(f"connection closed {end}")
                frames = decoder.filled(count)
                if frames:
                    reading.on_frames(frames)
                if count < room:
                    break  # the kernel had no more (TLS: see ``buffered``); spare a futile read
            else:
                self._again.add(reading)  # more may be there: after the others' turn
                return
            if stream.buffered():
                self._again.add(reading)
        except Exception as exc:  # noqa: BLE001 - whatever it was, this connection is over
            self._unregister(stream)
            self._safely(partial(reading.on_end, exc))

    @staticmethod
    def _safely(call: Callable[[], Any]) -> None:
        try:
            call()
        except Exception:  # the loop serves everyone: it must not die
            log.exception("wire loop callback %r failed", call)


_shared = PerProcess(WireLoop)


def wire_loop() -> WireLoop:
    """The process's wire loop, started on first use (a forked child starts its own)."""
    return _shared.get()
