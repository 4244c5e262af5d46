"""Follow a running bootstrap script from its output: which step runs, how long each took, and
what the failing one printed.

The script prints ``::step NAME`` as each step begins, ``::failed CODE COMMAND`` from its ERR
trap, ``::error MESSAGE`` when a check of its own fails, and ``::agent-port N`` at the end;
everything else is the steps' own output (stderr is merged into stdout, so the order is kept). ``StepWatcher`` is the ``out_stream`` of the SSH
exec: it sees those lines as they arrive and reports each step's start and end at once.
"""

from __future__ import annotations

import io
import re
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

STEP, FAILED, ERROR, AGENT_PORT = "::step ", "::failed ", "::error ", "::agent-port "
#: Output lines kept per step for the error message of a failed one.
TAIL_LINES = 20
_URL_CREDENTIALS = re.compile(r"(://)[^/\s:@]+:[^/\s@]+@")


def redact(text: str) -> str:
    """Hide the user:password part of URLs (a private index's), so no error shows it."""
    return _URL_CREDENTIALS.sub(r"\1***@", text)


@dataclass(frozen=True, slots=True)
class StepUpdate:
    """A step of node ``node``'s bootstrap started, completed or failed (``index`` of ``total``)."""

    node: int
    name: str
    status: Literal["started", "completed", "failed"]
    index: int
    total: int
    duration: float | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class StepFailure:
    """What the failing step was doing: its command and exit code (from the ERR trap) or the
    script's own reason, and the last lines it printed."""

    step: str
    command: str | None
    exit_code: int
    tail: tuple[str, ...]
    reason: str | None = None

    @property
    def summary(self) -> str:
        """``running `cmd` (exit code 7)`` or the reason, for events and messages."""
        if self.reason:
            return f"{self.reason} (exit code {self.exit_code})"
        command = f"running `{self.command}` " if self.command else ""
        return f"{command}(exit code {self.exit_code})"

    def describe(self, node: int) -> str:
        """The BootstrapError message: node, step, command, exit code and output tail."""
        tail = "\n".join(f"  | {line}" for line in self.tail) or "  (no output)"
        return redact(f"bootstrap of node {node} failed at step {self.step!r} {self.summary}; "
                      f"its last output:\n{tail}")


class StepWatcher(io.TextIOBase):
    """A text stream fed the script's stdout chunk by chunk (by invoke's reader thread)."""

    def __init__(self, node: int, steps: Sequence[str],
                 on_step: Callable[[StepUpdate], Any] | None = None,
                 on_line: Callable[[str], Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node, self.steps = node, list(steps)
        self.on_step, self.on_line, self.clock = on_step, on_line, clock
        self.current: str | None = None
        self.started_at = 0.0
        self.durations: dict[str, float] = {}
        self.agent_port: int | None = None
        self.failed: tuple[int, str] | None = None
        self.error: str | None = None
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:  # type: ignore[override]
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line.rstrip("\r"))
        return len(text)

    def _line(self, line: str) -> None:
        if line.startswith(STEP):
            self._finish()
            self.current, self.started_at = line[len(STEP):].strip(), self.clock()
            self.tail.clear()
            self._report("started")
        elif line.startswith(FAILED):
            code, _, command = line[len(FAILED):].partition(" ")
            self.failed = (int(code) if code.isdigit() else 1, command.strip())
        elif line.startswith(ERROR):
            self.error = line[len(ERROR):].strip()
        elif line.startswith(AGENT_PORT):
            self._finish()
            self.agent_port = int(line.split()[1])
        else:
            self.tail.append(line)
            if self.on_line is not None and line.strip():
                self.on_line(redact(line))

    def _finish(self) -> None:
        if self.current is not None:
            self.durations[self.current] = self.clock() - self.started_at
            self._report("completed", self.durations[self.current])
            self.current = None

    def _report(self, status: Literal["started", "completed", "failed"],
                duration: float | None = None, detail: str = "") -> None:
        if self.on_step is None or self.current is None:
            return
        index = self.steps.index(self.current) if self.current in self.steps else len(self.steps)
        self.on_step(StepUpdate(self.node, self.current, status, index,
                                max(len(self.steps), index + 1), duration, detail))

    def failure(self, exit_code: int, reason: str | None = None) -> StepFailure:
        """The script ended with ``exit_code`` (or ``reason``, e.g. a timeout): report the
        running step failed and describe it."""
        if self._partial:
            self._line(self._partial)
            self._partial = ""
        code, command = self.failed if self.failed else (exit_code, None)
        failure = StepFailure(self.current or "start", command, code, tuple(self.tail),
                              reason or self.error)
        if self.current is not None:
            self._report("failed", self.clock() - self.started_at, redact(failure.summary))
        return failure
