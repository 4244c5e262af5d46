"""``Teardown``: the steps that end a pool, every one of which runs whatever the others raise.

Steps are registered as the pool comes up and run in reverse order when it closes (like
``contextlib.ExitStack``), but with the error handling a pool needs: each step runs even when
an earlier one raised (a dead head, a cancelled future, a Ctrl+C in the middle), and the
*first* error is raised after the last step, so the stack's destroy (registered first, run
last) is never skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("skyward")


class Teardown:
    """Named steps run in reverse registration order; see the module doc."""

    def __init__(self, stack: str) -> None:
        self.stack = stack
        self._steps: list[tuple[str, Callable[[], Any]]] = []
        self.errors: list[tuple[str, BaseException]] = []

    def add(self, name: str, step: Callable[[], Any]) -> None:
        """Run ``step`` at teardown, before every step added earlier."""
        self._steps.append((name, step))

    def run(self) -> None:
        """Run every step (newest first), then raise the first error, if any."""
        steps, self._steps = self._steps, []
        for name, step in reversed(steps):
            try:
                step()
            except BaseException as exc:  # noqa: BLE001 - the remaining steps still run
                self.errors.append((name, exc))
                if isinstance(exc, KeyboardInterrupt):  # not a failure: raised again at the end
                    log.warning("stack %s: closing the pool, Ctrl+C during %s", self.stack,
                                name)
                else:
                    log.error("stack %s: closing the pool, %s failed: %s: %s", self.stack,
                              name, type(exc).__name__, exc)
        if self.errors:
            raise self.errors[0][1]
