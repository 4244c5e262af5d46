"""How the agent logs the connections it refuses: the first at once, the rest summed up.

A flood of peers without the stack token (a port scanner, a misconfigured client retrying)
used to write one WARNING per connection: 3,000 lines from one flood. Now the first refusal of
a quiet spell is logged as it happens, later ones are counted, and every ``every`` seconds one
line says how many were refused and from where; a spell with no refusal ends the summaries.
Whatever the flood, the log gets at most one line per interval.

``RefusalTally`` is the policy (pure: the time is passed in); ``RefusalLog`` drives it from a
timer thread and writes the lines.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

#: Seconds between two summaries of refused connections.
SUMMARY_EVERY = 60.0
#: How many distinct peers a summary names (the others are counted).
NAMED_PEERS = 3


@dataclass
class RefusalTally:
    """Refusals since the last line written, and when the next summary is due."""

    every: float = SUMMARY_EVERY
    count: int = 0
    peers: dict[str, int] = field(default_factory=dict)
    #: When the current spell's next summary is due; None: no spell, the next refusal is
    #: logged at once.
    due: float | None = None

    def refused(self, peer: str, now: float) -> str | None:
        """Count one refusal from ``peer``; the line to log now, if any (the first one of a
        spell)."""
        if self.due is None:
            self.due = now + self.every
            return (f"rejected a connection without the stack token from {peer}; further "
                    f"refusals are summed up every {self.every:g} s")
        self.count += 1
        self.peers[peer] = self.peers.get(peer, 0) + 1
        return None

    def summary(self, now: float) -> str | None:
        """The summary line when one is due (and resets the count); None otherwise. A due
        interval with nothing refused ends the spell."""
        if self.due is None or now < self.due:
            return None
        if not self.count:
            self.due = None
            return None
        line = self._line(f"in the last {self.every:g} s")
        self.due = now + self.every
        return line

    def flush(self) -> str | None:
        """What is counted but not yet said (at shutdown), as a line; the count is reset."""
        return self._line("since the last line") if self.count else None

    def _line(self, when: str) -> str:
        named = sorted(self.peers, key=lambda peer: -self.peers[peer])[:NAMED_PEERS]
        others = len(self.peers) - len(named)
        where = ", ".join(named) + (f" and {others} other peer(s)" if others else "")
        line = f"refused {self.count} connection(s) without the stack token from {where} {when}"
        self.count, self.peers = 0, {}
        return line


class RefusalLog:
    """Logs refused connections to ``logger`` as ``RefusalTally`` decides (thread-safe)."""

    def __init__(self, logger: logging.Logger, every: float = SUMMARY_EVERY) -> None:
        self.log = logger
        self.tally = RefusalTally(every)
        self._lock = threading.Lock()
        self._timer: threading.Thread | None = None

    def refused(self, peer: str) -> None:
        """A connection from ``peer`` was refused."""
        with self._lock:
            first = self.tally.refused(peer, time.monotonic())
            if first is not None and self._timer is None:
                self._timer = threading.Thread(target=self._summarize, daemon=True,
                                               name="refusal-summary")
                self._timer.start()
        if first is not None:
            self.log.warning("%s", first)

    def flush(self) -> None:
        """Log what is counted but not yet said."""
        with self._lock:
            line = self.tally.flush()
        if line is not None:
            self.log.warning("%s", line)

    def _summarize(self) -> None:
        while True:
            with self._lock:
                due = self.tally.due
                if due is None:
                    self._timer = None
                    return
            time.sleep(max(0.0, due - time.monotonic()))
            with self._lock:
                line = self.tally.summary(time.monotonic())
            if line is not None:
                self.log.warning("%s", line)
