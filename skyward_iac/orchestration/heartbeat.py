"""The client's side of the dead-man switch: write every node's heartbeat file over SFTP.

Each beat rewrites the file with a new beat count; the node's watchdog notes on its own
monotonic clock when it saw the file change (node/watchdog.py on Local, the cloud-init
watchdog on clouds), so no time of this machine travels with a beat and its clock cannot
matter. While beats arrive, a node keeps living; when they stop for ``ttl`` seconds (this
process died, lost the network, or the node is unreachable) the node stops itself. A node is
beaten from its first SSH contact until the pool closes: through its bootstrap over an SFTP
channel of its own (nothing else, the bootstrap's uploads or a closed cached client, can take
it away), and once its agent is attached over the agent connection (``attached``: a ``Beat``
message the agent writes to the same file), so a node needs no SSH connection to stay alive.
A failing beat is a warning at once; a node unreachable for ``ttl`` has stopped itself
and is reported lost. A pool with a budget also tells each node, before its first beat and
again after every change, how many seconds the budget leaves (``BUDGET_FILE``, a duration its
watchdog counts on the node's clock; ``orchestration/budget.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import wait
from dataclasses import dataclass, field
from typing import Any, Protocol

from skyward_iac.api.deadlines import (
    BUDGET_FILE,
    beat_interval,
    beat_timeout,
    unreached_too_long,
)
from skyward_iac.node.messages import Beat
from skyward_iac.orchestration.elastic import ElasticThreads
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.remote.bootstrap import HEARTBEAT_FILE

log = logging.getLogger("skyward")


class BeatSender(Protocol):
    """What carries a node's beats once it is attached (its ``AgentClient``)."""

    def send(self, message: object) -> None:
        """Send one control message; ``OSError`` when the connection is broken."""
        ...


@dataclass
class _Beat:
    index: int
    #: The node's SSH connection (its ``client`` opens the SFTP channel); also what names
    #: this registration in ``remove`` and ``attached``.
    connection: Any
    path: str
    last_ok: float
    sftp: Any = None
    #: Set once the node's agent is attached: beats go over its connection from then on.
    agent: BeatSender | None = None
    failures: int = 0
    #: Beats written so far: each beat writes the next count, so each one changes the file.
    count: int = 0
    #: Held while a beat is under way: a node is never beaten twice at once.
    busy: threading.Lock = field(default_factory=threading.Lock)
    #: The version of the notes this node was last told (None: not yet).
    told: int | None = None


class Notes(Protocol):
    """What a node is told beside its beats (the budget's seconds left)."""

    def note(self) -> tuple[int, str]:
        """The text now, and its version (it moves when the text must be told again)."""
        ...

    def listen(self, callback: Callable[[], Any]) -> None:
        """Call ``callback()`` whenever the version moves."""
        ...


class Heartbeat:
    """Beats every registered node every ``beat_interval(ttl)`` seconds from a daemon thread.

    ``on_silent(index, reason)`` is called (once) for a node no beat has reached for ``ttl``
    seconds: it has stopped itself by now.
    """

    def __init__(self, ttl: float, on_silent: Callable[[int, str], Any],
                 identity: PoolIdentity, notes: Notes | None = None) -> None:
        self.ttl = ttl
        self.notes = notes
        self.interval = beat_interval(ttl)
        self.on_silent = on_silent
        self.identity = identity
        self._beats: dict[int, _Beat] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        # Up to 8 beats at once; none held between rounds (beats over the agent are quick).
        self._threads = ElasticThreads(8, name="skyward-beat")
        self._thread = threading.Thread(target=self._run, name="skyward-heartbeat", daemon=True)
        self._thread.start()
        if notes is not None:
            notes.listen(self.tell_all)

    def add(self, index: int, connection: Any, workdir: str) -> None:
        """Start beating node ``index`` over SFTP (at its first SSH contact), with one beat
        now. ``connection``: anything with a paramiko ``client`` (a ``fabric.Connection``)."""
        beat = _Beat(index, connection, f"{workdir}/{HEARTBEAT_FILE}", time.monotonic())
        with self._lock:
            old = self._beats.get(index)
            self._beats[index] = beat
        if old is not None:
            _close(old)
        self._beat(beat)

    def attached(self, index: int, connection: Any, agent: BeatSender) -> None:
        """Node ``index`` (registered with ``connection``) has its agent attached: beat it
        over ``agent`` from now on, with one beat now, and close its SFTP channel (its SSH
        connection may close after this returns)."""
        with self._lock:
            beat = self._beats.get(index)
        if beat is None or beat.connection is not connection:
            return
        with beat.busy:  # a beat over SFTP under way ends first
            beat.agent = agent
            _close(beat)
            self._beat_once(beat)

    def tell_all(self) -> None:
        """Beat every node now, each told the notes' new text (they changed)."""
        if self._stopped.is_set():
            return
        with self._lock:
            beats = list(self._beats.values())
        for beat in beats:
            try:
                self._threads.submit(self._beat, beat)
            except RuntimeError:
                return  # stopping: the pool closes anyway

    def remove(self, index: int, connection: Any = None) -> None:
        """Stop beating node ``index`` (only if still registered with ``connection``)."""
        with self._lock:
            beat = self._beats.get(index)
            if beat is None or (connection is not None and beat.connection is not connection):
                return
            del self._beats[index]
        _close(beat)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            with self._lock:
                beats = list(self._beats.values())
            # A beat stuck behind a large frame on its agent connection holds back no other
            # node's: the next round skips a node whose beat is still under way.
            wait([self._threads.submit(self._beat, beat) for beat in beats],
                 timeout=beat_timeout(self.ttl))
            now = time.monotonic()
            for beat in beats:
                silent = now - beat.last_ok
                if unreached_too_long(beat.last_ok, now, self.ttl) and not self._stopped.is_set():
                    self.remove(beat.index, beat.connection)
                    log.error("stack %s: no heartbeat reached node %d for %.0fs (ttl %gs): it has "
                              "stopped itself", self.identity.stack, beat.index, silent,
                              self.ttl)
                    self.on_silent(beat.index, f"no heartbeat reached it for {silent:.0f}s "
                                               f"(ttl {self.ttl:g}s)")

    def _beat(self, beat: _Beat) -> None:
        if not beat.busy.acquire(blocking=False):
            return  # a beat is under way already
        try:
            self._beat_once(beat)
        finally:
            beat.busy.release()

    def _beat_once(self, beat: _Beat) -> None:
        try:
            if beat.agent is not None:
                self._beat_agent(beat, beat.agent)
            else:
                self._beat_sftp(beat)
        except Exception as exc:  # noqa: BLE001 - any failure is reported the same way
            _close(beat)
            beat.failures += 1
            if self._stopped.is_set():
                return
            silent = time.monotonic() - beat.last_ok
            # Loud, and again every few failures: a node whose beats fail stops itself at ttl.
            if beat.failures == 1 or beat.failures % 5 == 0:
                log.warning("stack %s: heartbeat to node %d failed (%s: %s); no beat for %.0fs, "
                            "it stops itself after %gs", self.identity.stack, beat.index,
                            type(exc).__name__, exc, silent, self.ttl)
            return
        if beat.failures:
            log.info("stack %s: heartbeat to node %d works again", self.identity.stack,
                     beat.index)
        beat.failures = 0
        beat.last_ok = time.monotonic()

    def _note(self, beat: _Beat) -> tuple[int | None, str | None]:
        """The notes' version and text when the node must be told them (else the version it
        was told and None)."""
        if self.notes is None:
            return beat.told, None
        version, text = self.notes.note()
        return (version, text) if version != beat.told else (beat.told, None)

    def _beat_agent(self, beat: _Beat, agent: BeatSender) -> None:
        version, text = self._note(beat)
        agent.send(Beat(beat.count + 1, text))
        beat.count += 1
        beat.told = version

    def _beat_sftp(self, beat: _Beat) -> None:
        if beat.sftp is None:
            beat.sftp = beat.connection.client.open_sftp()
            beat.sftp.get_channel().settimeout(beat_timeout(self.ttl))
        version, text = self._note(beat)
        if text is not None:
            _write_text(beat.sftp, f"{beat.path.rpartition('/')[0]}/{BUDGET_FILE}", text)
            beat.told = version
        _write_beat(beat.sftp, beat.path, beat.count + 1)
        beat.count += 1

    def stop(self) -> None:
        """Stop beating every node (the pool is closing)."""
        self._stopped.set()
        self._thread.join(timeout=self.interval + beat_timeout(self.ttl) + 1)
        with self._lock:
            beats, self._beats = list(self._beats.values()), {}
        for beat in beats:
            _close(beat)
        self._threads.shutdown(wait=False)


def _write_beat(sftp: Any, path: str, count: int) -> None:
    """Write beat ``count`` to ``path`` (created if the node has none yet). What the watchdog
    sees is the change; the times the file gets are the node's own."""
    _write_text(sftp, path, f"beat {count}\n")


def _write_text(sftp: Any, path: str, text: str) -> None:
    with sftp.open(path, "w") as handle:
        handle.write(text)


def _close(beat: _Beat) -> None:
    sftp, beat.sftp = beat.sftp, None
    if sftp is not None:
        try:
            sftp.close()
        except Exception:  # noqa: BLE001 - closing a broken channel
            pass
